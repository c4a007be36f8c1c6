//! The socket keeper: what removes a process's local sockets after it dropped its privileges.
//!
//! A process that binds its sockets (a configuration socket, a counters socket, a vhost-user socket) in a
//! root-owned directory such as `/var/run/wireguard` or `/run/turbotun` and then becomes an unprivileged user can
//! no longer remove them when it ends. Before the drop it starts [`start_socket_keeper`]: the same program again,
//! as root without capabilities, holding the other end of a pipe. When the pipe closes (the process ended, however
//! it ended) the keeper removes each socket that is still the one it was told about (by inode), and nothing else.
//! The program calls [`keep_socket`] first thing when [`KEEPER_ENV`] is set.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::error::{ConfigError, Error, Result};

/// The environment variable that makes the program the socket keeper of [`keep_socket`]: `INODE:PATH` lines.
pub const KEEPER_ENV: &str = "TURBOTUN_SOCKET_KEEPER";

/// Starts the socket keeper: this program again, as root without capabilities, holding the other end of a pipe
/// that this process keeps open until it ends (the returned child's standard input). A process that dropped its
/// privileges cannot remove its sockets (`(path, inode)`) from a root-owned directory; the keeper does when the
/// pipe closes. The keeper gets no environment but [`KEEPER_ENV`], so that nothing meant for this process (a
/// request to report readiness, a log setting) reaches it.
pub fn start_socket_keeper(sockets: &[(PathBuf, u64)]) -> Result<SocketKeeper> {
    let program = std::env::current_exe().map_err(|e| Error::io("finding this program for the socket keeper", e))?;
    let spec: Vec<String> = sockets.iter().map(|(path, inode)| format!("{inode}:{}", path.display())).collect();
    let child = Command::new(program)
        .env_clear()
        .env(KEEPER_ENV, spec.join("\n"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own group: a terminal's Ctrl-C reaches the process, which then ends, and the keeper after it.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io("starting the socket keeper", e))?;
    Ok(SocketKeeper(Some(child)))
}

/// The running socket keeper ([`start_socket_keeper`]). Dropped, it closes the pipe and waits (a second at most)
/// for the keeper to remove the sockets, so that a process ending normally has its sockets gone when it exits;
/// one that is killed leaves the keeper to do it just after.
#[derive(Debug)]
pub struct SocketKeeper(Option<Child>);

/// How long a process waits at its end for its keeper.
const KEEPER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for SocketKeeper {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else { return };
        drop(child.stdin.take());
        let deadline = std::time::Instant::now() + KEEPER_WAIT;
        while std::time::Instant::now() < deadline {
            match child.try_wait() {
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(2)),
                _ => return,
            }
        }
    }
}

/// The socket keeper (see [`KEEPER_ENV`]): gives up every capability, waits until its standard input closes
/// (the process it keeps for has ended), then removes each socket of `INODE:PATH` (one per line) if it is still
/// the one with that inode.
pub fn keep_socket(spec: &OsStr) -> Result<()> {
    let spec = spec.to_string_lossy();
    let sockets = spec
        .lines()
        .map(|line| {
            line.split_once(':')
                .and_then(|(i, p)| Some((i.parse::<u64>().ok()?, PathBuf::from(p))))
                .ok_or_else(|| Error::Config(ConfigError::KeeperSpec { var: KEEPER_ENV, line: line.to_string() }))
        })
        .collect::<Result<Vec<_>>>()?;
    crate::deployment::privilege::give_up_capabilities()?;
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    for (inode, path) in sockets {
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == inode) {
            std::fs::remove_file(&path).map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
        }
    }
    Ok(())
}
