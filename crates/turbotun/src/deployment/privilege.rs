//! Privilege separation: open and configure devices as root, then become an ordinary user before forwarding.
//!
//! The way VMM jailers do it: everything that needs a privilege happens first (opening and configuring the
//! devices, attaching the steering program, the kernel probes of [`crate::Capabilities::get`]), then [`drop_to`]
//! gives the process up for good:
//!
//! 1. supplementary groups: only the target group (`setgroups`);
//! 2. gid, then uid: real, effective and saved (`setresgid`, `setresuid`; glibc applies them to every thread);
//! 3. capabilities: effective, permitted and inheritable cleared (`capset`), the ambient set cleared
//!    (`PR_CAP_AMBIENT_CLEAR_ALL`). The kernel already empties the permitted and effective sets when all uids
//!    leave 0, unless `SECBIT_KEEP_CAPS` is set: clearing them explicitly does not depend on that bit;
//! 4. `no_new_privs`: no later `execve` can gain anything (setuid binaries, file capabilities);
//! 5. a check of the result, read back from the kernel, and a try to become root again, which must fail.
//!
//! The process's dumpable flag (`PR_SET_DUMPABLE`) is what it was before: the kernel resets it to
//! `fs.suid_dumpable` when the uid or gid changes, which would undo a process's choice not to be dumped.
//!
//! Capabilities and `no_new_privs` belong to a thread, not to the process, so [`drop_to`] refuses to run while
//! the process has more than one thread: drop before starting workers (or a tokio runtime); threads started
//! afterwards inherit the dropped state.
//!
//! ```no_run
//! use turbotun::forward::{ForwardMode, ForwarderBuilder};
//! use turbotun::privilege::{drop_to, UserSpec};
//! use turbotun::Mode;
//!
//! # fn main() -> turbotun::Result<()> {
//! let user = UserSpec::new("nobody").resolve()?;          // before anything is opened: a typo fails early
//! let builder = ForwarderBuilder::new(ForwardMode::Offload);
//! let a = builder.device(Mode::Tun).name("tun-a").open()?;
//! let b = builder.device(Mode::Tun).name("tun-b").open()?;
//! // Attaches the steering program (needs CAP_BPF) and, in offload mode, runs the kernel probes (a private
//! // namespace for the coalesced-write probe; cached afterwards).
//! let forwarder = builder.build(a, b)?;
//! drop_to(&user)?;
//! forwarder.run()?;
//! # Ok(())
//! # }
//! ```

use std::fmt;

use nix::unistd::{Gid, Group, Uid, User};

use crate::error::{ConfigError, Error, Result};

/// The user (and optionally the group) to become: names or numbers, as `--user U --group G` take them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSpec {
    user: String,
    group: Option<String>,
}

impl UserSpec {
    /// A user given by name (`nobody`) or number (`65534`); the group is the user's primary group.
    pub fn new(user: impl Into<String>) -> Self {
        UserSpec { user: user.into(), group: None }
    }

    /// The group to become instead of the user's primary group, by name or number.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The user id alone: a number as it is (it need not have a passwd entry), a name looked up (`getpwnam`). For
    /// naming a peer that may be trusted (e.g. the user a hand-over's receiver runs as), not for becoming it.
    pub fn uid(&self) -> Result<u32> {
        let user = self.user.trim();
        if let Ok(uid) = user.parse::<u32>() {
            return Ok(uid);
        }
        if user.is_empty() {
            return Err(Error::Config(ConfigError::User { why: "empty user name: give a user such as nobody".into() }));
        }
        let found = User::from_name(user).map_err(|e| lookup_error(format!("looking up user {user:?}"), e))?;
        found.map(|u| u.uid.as_raw()).ok_or_else(|| Error::NoSuchUser { user: user.to_string() })
    }

    /// Looks the user and group up (`getpwnam`/`getpwuid`, `getgrnam`) and checks them. A numeric uid without
    /// a passwd entry is accepted when a group is given. Root (uid or gid 0) is refused: it would keep the power
    /// the drop is meant to give up.
    pub fn resolve(&self) -> Result<Identity> {
        let user = self.user.trim();
        if user.is_empty() {
            return Err(Error::Config(ConfigError::User { why: "empty user name: give a user such as nobody".into() }));
        }
        let entry = if let Ok(uid) = user.parse::<u32>() {
            User::from_uid(Uid::from_raw(uid)).map_err(|e| lookup_error(format!("looking up uid {uid}"), e))?
        } else {
            let found = User::from_name(user).map_err(|e| lookup_error(format!("looking up user {user:?}"), e))?;
            Some(found.ok_or_else(|| Error::NoSuchUser { user: user.to_string() })?)
        };
        let uid = match &entry {
            Some(entry) => entry.uid.as_raw(),
            None => user.parse::<u32>().unwrap_or_default(),
        };
        let gid = match &self.group {
            Some(group) => resolve_group(group)?,
            None => match &entry {
                Some(entry) => entry.gid.as_raw(),
                None => {
                    return Err(Error::Config(ConfigError::User {
                        why: format!("uid {uid} has no passwd entry, so it has no primary group: give a group as well"),
                    }))
                }
            },
        };
        if uid == 0 || gid == 0 {
            return Err(Error::Config(ConfigError::PrivilegeDrop {
                why: format!(
                    "dropping privileges to uid {uid} gid {gid} keeps root's: choose an unprivileged user and group \
                 such as nobody"
                ),
            }));
        }
        let name = entry.map(|e| e.name).unwrap_or_else(|| uid.to_string());
        Ok(Identity { name, uid, gid })
    }
}

/// A group id from a group name (`getgrnam`) or number, as `ip tuntap ... group` and `--group` take it.
pub fn group_id(group: &str) -> Result<u32> {
    resolve_group(group)
}

fn resolve_group(group: &str) -> Result<u32> {
    let group = group.trim();
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let found = Group::from_name(group).map_err(|e| lookup_error(format!("looking up group {group:?}"), e))?;
    found.map(|g| g.gid.as_raw()).ok_or_else(|| {
        Error::Config(ConfigError::User {
            why: format!(
                "no group named {group:?} on this system (see `getent group`): give an existing group or a gid"
            ),
        })
    })
}

fn lookup_error(context: String, e: nix::Error) -> Error {
    Error::io(context, std::io::Error::from(e))
}

/// A resolved user and group ([`UserSpec::resolve`]), what [`drop_to`] becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user's name (its number when it has no passwd entry).
    pub name: String,
    /// The uid: real, effective and saved after the drop.
    pub uid: u32,
    /// The gid: real, effective, saved and the only supplementary group after the drop.
    pub gid: u32,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (uid {}, gid {})", self.name, self.uid, self.gid)
    }
}

/// Gives up every privilege for good and becomes `identity` (see the module documentation for the steps).
/// Fails, naming the step, if any step fails or if the kernel's view afterwards is not exactly that: the
/// caller must then stop (the process may be half-dropped). Must run as root, with no other thread alive.
pub fn drop_to(identity: &Identity) -> Result<()> {
    let (uid, gid) = (Uid::from_raw(identity.uid), Gid::from_raw(identity.gid));
    if identity.uid == 0 || identity.gid == 0 {
        return Err(Error::Config(ConfigError::PrivilegeDrop {
            why: format!("dropping privileges to {identity} keeps root's"),
        }));
    }
    single_threaded()?;
    let step = |what: &str, e: nix::Error| {
        Error::io(format!("dropping privileges to {identity}: {what}"), std::io::Error::from(e))
    };
    // The kernel sets the dumpable flag to `fs.suid_dumpable` whenever the uid or gid changes: a process that
    // made itself non-dumpable (secret keys in memory) would become dumpable again where that is 1 (its memory
    // open to the user it became) or 2 (a core written with the keys). Read before the first change, put back
    // after the last.
    let dumpable = rustix::process::dumpable_behavior()
        .map_err(|e| Error::io(format!("dropping privileges to {identity}: PR_GET_DUMPABLE"), e.into()))?;
    // The bounding set first: emptying it needs CAP_SETPCAP, which the uid change below takes away.
    empty_bounding_set()
        .map_err(|e| Error::io(format!("dropping privileges to {identity}: PR_CAPBSET_DROP (needs CAP_SETPCAP)"), e))?;
    nix::unistd::setgroups(&[gid]).map_err(|e| step("setgroups (needs CAP_SETGID: run as root)", e))?;
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| step("setresgid (needs CAP_SETGID: run as root)", e))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| step("setresuid (needs CAP_SETUID: run as root)", e))?;
    // PR_SET_DUMPABLE takes 0 or 1: a process dumpable for root only (2) is put back as not dumpable.
    let dumpable = match dumpable {
        rustix::process::DumpableBehavior::DumpableReadableOnlyByRoot => rustix::process::DumpableBehavior::NotDumpable,
        other => other,
    };
    rustix::process::set_dumpable_behavior(dumpable)
        .map_err(|e| Error::io(format!("dropping privileges to {identity}: PR_SET_DUMPABLE"), e.into()))?;
    clear_capabilities()
        .map_err(|e| Error::io(format!("dropping privileges to {identity}: clearing capabilities"), e))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| {
        Error::io(format!("dropping privileges to {identity}: PR_SET_NO_NEW_PRIVS"), std::io::Error::from(e))
    })?;
    verify(identity)
}

/// Gives up every capability (all four sets and the bounding set) and sets `no_new_privs`, keeping the user:
/// for a helper that needs only what its uid owns (a root-owned directory to remove a file from), nothing the
/// capabilities of root would add. Must run with no other thread alive.
pub fn give_up_capabilities() -> Result<()> {
    single_threaded()?;
    empty_bounding_set().map_err(|e| Error::io("giving up capabilities: PR_CAPBSET_DROP", e))?;
    clear_capabilities().map_err(|e| Error::io("giving up capabilities", e))?;
    rustix::thread::set_no_new_privs(true)
        .map_err(|e| Error::io("giving up capabilities: PR_SET_NO_NEW_PRIVS", std::io::Error::from(e)))
}

/// Removes every capability this kernel knows from the calling thread's bounding set, so that nothing executed
/// later (a setuid-root or file-capability binary, were `no_new_privs` ever lifted) can gain one back. The kernel
/// answers EINVAL for the first number past its last capability; that is where the loop ends.
fn empty_bounding_set() -> std::io::Result<()> {
    use rustix::thread::{capability_is_in_bounding_set, remove_capability_from_bounding_set, CapabilitySet};
    for bit in 0..64 {
        let cap = CapabilitySet::from_bits_retain(1 << bit);
        match capability_is_in_bounding_set(cap) {
            Ok(true) => remove_capability_from_bounding_set(cap)?,
            Ok(false) => {}
            Err(rustix::io::Errno::INVAL) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Empties all four capability sets of the calling thread (dropping is always allowed).
fn clear_capabilities() -> std::io::Result<()> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    rustix::thread::clear_ambient_capability_set()?;
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none)?;
    Ok(())
}

/// Capabilities and `no_new_privs` are per thread: another live thread would keep what this one gives up.
/// A thread that was just joined may linger in `/proc/self/task` for a moment, hence the short retry.
fn single_threaded() -> Result<()> {
    let mut threads = 0;
    for _ in 0..50 {
        threads = std::fs::read_dir("/proc/self/task")
            .map_err(|e| Error::io("counting this process's threads in /proc/self/task", e))?
            .count();
        if threads <= 1 {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Err(Error::Config(ConfigError::PrivilegeDrop {
        why: format!(
            "this process has {threads} threads: drop privileges before starting any (capabilities and no_new_privs \
         belong to each thread, so the others would keep theirs)"
        ),
    }))
}

/// What the kernel says about the calling thread after the drop; any difference is an error.
fn verify(identity: &Identity) -> Result<()> {
    let status = ThreadStatus::read("/proc/thread-self/status")?;
    let expected = ThreadStatus {
        uids: [identity.uid; 4],
        gids: [identity.gid; 4],
        groups: vec![identity.gid],
        cap_inh: 0,
        cap_prm: 0,
        cap_eff: 0,
        cap_amb: 0,
        cap_bnd: 0,
        no_new_privs: true,
    };
    if status != expected {
        return Err(Error::Config(ConfigError::PrivilegeDrop {
            why: format!("dropping privileges to {identity} did not take: the kernel reports {status:?}"),
        }));
    }
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(Error::Config(ConfigError::PrivilegeDrop {
            why: format!("dropped to {identity}, yet setuid(0) still succeeds"),
        }));
    }
    Ok(())
}

/// The identity and privilege lines of `/proc/PID/task/TID/status` (or `/proc/PID/status`): what a test or a
/// supervisor reads to check a dropped process from outside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadStatus {
    /// `Uid:` real, effective, saved, filesystem.
    pub uids: [u32; 4],
    /// `Gid:` real, effective, saved, filesystem.
    pub gids: [u32; 4],
    /// `Groups:` the supplementary groups.
    pub groups: Vec<u32>,
    /// `CapInh:` the inheritable set.
    pub cap_inh: u64,
    /// `CapPrm:` the permitted set.
    pub cap_prm: u64,
    /// `CapEff:` the effective set.
    pub cap_eff: u64,
    /// `CapAmb:` the ambient set.
    pub cap_amb: u64,
    /// `CapBnd:` the bounding set (the most any later `execve` could grant).
    pub cap_bnd: u64,
    /// `NoNewPrivs: 1`.
    pub no_new_privs: bool,
}

impl ThreadStatus {
    /// Reads and parses a status file.
    pub fn read(path: impl AsRef<std::path::Path>) -> Result<ThreadStatus> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        ThreadStatus::parse(&text).ok_or_else(|| {
            Error::Config(ConfigError::PrivilegeDrop {
                why: format!("{} lacks Uid/Gid/Cap*/NoNewPrivs lines", path.display()),
            })
        })
    }

    /// Parses the text of a status file; `None` if a line this struct needs is missing or malformed.
    pub fn parse(text: &str) -> Option<ThreadStatus> {
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':'))).map(str::trim)
        };
        let ids = |name: &str| -> Option<[u32; 4]> {
            let v: Vec<u32> = field(name)?.split_whitespace().map(|x| x.parse().ok()).collect::<Option<_>>()?;
            v.try_into().ok()
        };
        let caps = |name: &str| u64::from_str_radix(field(name)?, 16).ok();
        Some(ThreadStatus {
            uids: ids("Uid")?,
            gids: ids("Gid")?,
            groups: field("Groups")?.split_whitespace().map(|x| x.parse().ok()).collect::<Option<_>>()?,
            cap_inh: caps("CapInh")?,
            cap_prm: caps("CapPrm")?,
            cap_eff: caps("CapEff")?,
            cap_amb: caps("CapAmb")?,
            cap_bnd: caps("CapBnd")?,
            no_new_privs: field("NoNewPrivs")? == "1",
        })
    }

    /// Whether this is exactly `uid`/`gid` everywhere with no capability in any set (the bounding set included)
    /// and `no_new_privs` on.
    pub fn is_dropped_to(&self, uid: u32, gid: u32) -> bool {
        self.uids == [uid; 4]
            && self.gids == [gid; 4]
            && self.groups.iter().all(|g| *g == gid)
            && self.cap_inh == 0
            && self.cap_prm == 0
            && self.cap_eff == 0
            && self.cap_amb == 0
            && self.cap_bnd == 0
            && self.no_new_privs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_resolve_names_numbers_and_refusals() {
        let nobody = UserSpec::new("nobody").resolve().expect("nobody exists");
        assert_ne!(nobody.uid, 0);
        assert_eq!(UserSpec::new(nobody.uid.to_string()).resolve().unwrap(), nobody);
        let err = UserSpec::new("no-such-user-ttx").resolve().unwrap_err().to_string();
        assert!(err.contains("no user named \"no-such-user-ttx\""), "{err}");
        let err = UserSpec::new("nobody").group("no-such-group-ttx").resolve().unwrap_err().to_string();
        assert!(err.contains("no group named \"no-such-group-ttx\""), "{err}");
        let err = UserSpec::new("root").resolve().unwrap_err().to_string();
        assert!(err.contains("keeps root's"), "{err}");
        let err = UserSpec::new("nobody").group("0").resolve().unwrap_err().to_string();
        assert!(err.contains("keeps root's"), "{err}");
        // A uid no passwd entry names needs a group; with one it is taken as given.
        let err = UserSpec::new("3999999").resolve().unwrap_err().to_string();
        assert!(err.contains("no primary group"), "{err}");
        let id = UserSpec::new("3999999").group("3999998").resolve().unwrap();
        assert_eq!((id.uid, id.gid, id.name.as_str()), (3999999, 3999998, "3999999"));
        assert!(UserSpec::new(" ").resolve().unwrap_err().to_string().contains("empty user name"));
    }

    #[test]
    fn test_parse_status() {
        let text = "Name:\tturbotun\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n\
                    Groups:\t65534 \nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
                    CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n\
                    NoNewPrivs:\t1\n";
        let status = ThreadStatus::parse(text).unwrap();
        assert!(status.is_dropped_to(65534, 65534), "{status:?}");
        let root = text.replace("Uid:\t65534\t65534\t65534", "Uid:\t0\t65534\t65534");
        assert!(!ThreadStatus::parse(&root).unwrap().is_dropped_to(65534, 65534));
        let bounding = text.replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff");
        let bounding = ThreadStatus::parse(&bounding).unwrap();
        assert_eq!(bounding.cap_bnd, 0x1ff_ffff_ffff);
        assert!(!bounding.is_dropped_to(65534, 65534), "a full bounding set is not dropped");
        let caps = text.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000001000");
        assert_eq!(ThreadStatus::parse(&caps).unwrap().cap_eff, 1 << 12);
        assert!(ThreadStatus::parse("Uid:\t1 2 3\n").is_none());
        let own = ThreadStatus::read("/proc/thread-self/status").unwrap();
        assert_eq!(own.uids[0], nix::unistd::getuid().as_raw());
    }
}
