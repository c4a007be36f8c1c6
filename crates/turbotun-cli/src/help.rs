//! What `--help` and the manual pages say beyond the options clap lists: EXAMPLES, EXIT STATUS and ENVIRONMENT
//! for every command, written once here and put into both (the pages are generated from the same clap
//! definitions with clap_mangen; `turbotun man DIR` writes them, `make install` installs them).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Command;

/// The sections of one command's help.
pub struct Page {
    /// A command line and what it does.
    pub examples: &'static [(&'static str, &'static str)],
    /// An exit status and what it means.
    pub exit: &'static [(&'static str, &'static str)],
    /// Environment variables it reads.
    pub environment: Vec<(&'static str, &'static str)>,
    /// Paragraphs a reader of this command needs beyond its options (its log, its counters).
    pub notes: &'static [&'static str],
}

/// The log and counters of a WireGuard endpoint, as README.md's "Logs" and "Counters" say them.
const WG_NOTES: &[&str] = &[
    "LOGS: on standard error, as wireguard-go's. LOG_LEVEL=verbose logs what wireguard-go's verbose log does, in its form (`wg0: peer(uBo0…zRXc) - Sending handshake initiation`, keypairs, keepalives, each configuration change), never a line per data packet; lines any sender can cause at most 10 every 5 s; no key is ever logged. Unset: warnings and errors, so that a configuration the endpoint refused is seen. In the background the log goes where standard error went (a terminal, a file, the journal: journalctl -u wg-quick@wg0); to a pipe only when LOG_LEVEL or RUST_LOG is set. Interval lines and the closing summary go to the log there too.",
    "COUNTERS: served on /run/turbotun/NAME.stats (root only; NAME@NETNS.stats in another network namespace) while it runs: `turbotun stats NAME` (--json, --prometheus, --peers), every drop by reason; --stats-interval SECS prints a line per interval; --stats-socket PATH.stats serves them elsewhere, none serves none. Each peer's counters are listed while the device holds at most --peer-metrics-limit peers (100,000).",
];

const USAGE: (&str, &str) = ("2", "bad arguments (the usage error is printed)");
const DONE: &[(&str, &str)] = &[
    ("0", "done"),
    ("1", "an error, said on standard error as `turbotun COMMAND: what failed: why` (nothing is left half made)"),
    USAGE,
];
const RUNNING: &[(&str, &str)] = &[
    ("0", "stopped by SIGINT or SIGTERM; the counters are printed"),
    ("1", "it could not start, or failed while running (a device deleted under it, for one): the error on standard error, the counters so far on standard output"),
    USAGE,
];
const WG_EXIT: &[(&str, &str)] = &[
    ("0", "in the background: the endpoint is up; in the foreground (-f): it ended, by SIGINT or SIGTERM, the device deleted (wg-quick down, ip link del) or its configuration socket removed"),
    ("1", "it could not start (the error on standard error, once), or failed while running (in the log)"),
    USAGE,
];
/// What every command's log reads (`logging.rs`).
const LOG_ENV: &[(&str, &str)] = &[
    ("LOG_LEVEL", "verbose (or debug): everything down to debug messages; error: errors only; silent: nothing. Unset: warnings and errors."),
    ("RUST_LOG", "tracing directives (debug, turbotun=trace,warn); when set, it takes precedence over LOG_LEVEL."),
];
const WG_ENV: &[(&str, &str)] = &[
    ("LOG_LEVEL", "verbose (or debug): everything down to debug messages; error: errors only; silent: nothing. Unset: warnings and errors (a refused configuration is a warning). As wireguard-go reads it."),
    ("RUST_LOG", "tracing directives (debug, turbotun_wg=trace,warn); when set, it takes precedence over LOG_LEVEL."),
    ("TURBOTUN_AEAD", "ring: seal and open transport data with ring's ChaCha20-Poly1305 even where Intel's IPsec-MB runs its AVX-512 code (the choice without it, the faster; LOG_LEVEL=verbose names the one chosen)."),
    ("WG_QUICK_USERSPACE_IMPLEMENTATION", "read by wg-quick, not by turbotun: set it to turbotun-wg to have wg-quick up run this endpoint. wg-quick uses it only when `ip link add NAME type wireguard` fails, i.e. when the kernel has no WireGuard module."),
];

/// The page of a command, by its path (`turbotun`, `turbotun fwd`, `turbotun load gen`, `turbotun-wg`).
pub fn page(path: &str) -> Option<Page> {
    let page = |examples, exit, environment: &'static [(&'static str, &'static str)]| {
        Some(Page { examples, exit, environment: environment.to_vec(), notes: &[] })
    };
    match path {
        "turbotun" => page(
            &[
                ("turbotun info", "Every TUN/TAP device in this network namespace: flags, queues, holders, offloads, counters."),
                ("turbotun fwd tta ttb", "Forward between two devices (created if missing) until Ctrl-C; a summary at the end."),
                ("sudo turbotun stats", "The counters of every running fwd, tunnel and wg."),
                ("turbotun completions bash > /etc/bash_completion.d/turbotun", "Shell completions (bash, zsh, fish)."),
            ],
            DONE,
            &[
                ("LOG_LEVEL", "verbose (or debug), error, silent; unset: warnings and errors (see turbotun-wg(1))."),
                ("RUST_LOG", "tracing directives; when set, it takes precedence over LOG_LEVEL."),
                ("TURBOTUN_NO_URING", "1: fwd never uses io_uring."),
            ],
        ),
        "turbotun features" => page(
            &[("turbotun features", "What this kernel's tun driver offers."), ("turbotun features --json", "The same as JSON.")],
            DONE,
            &[],
        ),
        "turbotun info" => page(
            &[
                ("turbotun info", "Every TUN/TAP device in this network namespace."),
                ("turbotun info tun0 --json", "One device as JSON (queues, the pids holding them, owner, offloads, counters)."),
            ],
            &[("0", "done"), ("1", "no such device, or it is not TUN/TAP"), USAGE],
            &[],
        ),
        "turbotun create" => page(
            &[
                ("turbotun create tun0 --owner alice", "A persistent TUN device that alice may open without privileges (names as ip tuntap takes them)."),
                ("turbotun create tap0 --tap --queues 4 --group kvm --offloads all", "A multiqueue TAP device with a virtio header and every offload, for members of kvm."),
                ("turbotun create tap1 --tap --master br0 --mac 02:00:00:00:00:01", "A TAP device on a bridge, with its MAC address."),
            ],
            &[
                ("0", "created (a warning on standard error when any local user may attach)"),
                ("1", "not created: the device exists (delete it first), a bad option, no privilege"),
                USAGE,
            ],
            &[],
        ),
        "turbotun set" => page(
            &[
                ("turbotun set tap0 --master br0", "Put tap0 on the bridge br0."),
                ("turbotun set tap0 --carrier off", "Turn the carrier off (NO-CARRIER) while a process holds the device."),
            ],
            DONE,
            &[],
        ),
        "turbotun delete" => page(
            &[("turbotun delete tun0", "Delete a persistent device (as ip tuntap del does).")],
            &[("0", "deleted"), ("1", "no such device, not persistent, or held by a process (named)"), USAGE],
            &[],
        ),
        "turbotun fwd" => page(
            &[
                ("turbotun fwd tta ttb", "Forward between two TUN devices (created if missing) until Ctrl-C."),
                ("turbotun fwd tta ttb --stats-interval 1", "The same, with a line of rates every second, as iperf3 prints them."),
                ("turbotun fwd tta ttb --tap --mode passthrough --queues 2 --user nobody --json", "Two-queue TAP passthrough, as nobody once set up, counters as JSON."),
            ],
            RUNNING,
            &[("TURBOTUN_NO_URING", "1: never use io_uring (--io uring then falls back to block).")],
        ),
        "turbotun echo" => page(
            &[("turbotun echo tt0 --addr 10.9.0.1/24", "Answer pings and UDP to every other address of 10.9.0.0/24 through tt0.")],
            RUNNING,
            &[],
        ),
        "turbotun open" => page(
            &[(
                "turbotun open tta --send-to /run/fwd/queues.sock --to-user nobody",
                "As root: open tta and hand its queues to `turbotun fwd --from-socket /run/fwd/queues.sock` running as nobody.",
            )],
            DONE,
            &[],
        ),
        "turbotun load" => page(
            &[
                ("turbotun load sink --local 0.0.0.0:9000 --duration 10", "Count what arrives on UDP port 9000 for 10 s."),
                ("turbotun load gen --remote 10.9.0.2:9000 --rate 100000 --duration 5", "Send 100,000 datagrams a second for 5 s."),
            ],
            DONE,
            &[],
        ),
        "turbotun load gen" => page(
            &[("turbotun load gen --remote 10.9.0.2:9000 --rate 100000 --size 1200 --flows 4", "Four flows of 1200-byte datagrams, 100,000 a second in all.")],
            DONE,
            &[],
        ),
        "turbotun load sink" => page(
            &[("turbotun load sink --local [::]:9000 --gro --json", "Count what arrives (coalesced reads) until Ctrl-C, as JSON.")],
            DONE,
            &[],
        ),
        "turbotun tunnel" => page(
            &[
                (
                    "turbotun tunnel tt0 --local 192.0.2.1:5555 --remote 192.0.2.2:5555",
                    "An unencrypted tunnel to another turbotun tunnel; then give tt0 an address and bring it up with ip.",
                ),
                ("turbotun tunnel tt0 --local 0.0.0.0:5555 --remote peer.example:5555 --stats-interval 5", "Host names are resolved; a line of rates every 5 s."),
            ],
            RUNNING,
            &[],
        ),
        "turbotun vhost-user" => page(
            &[
                (
                    "sudo turbotun vhost-user --socket /run/vm0.sock --device vm0 --user qemu",
                    "Serve vm0 to a VM monitor running as qemu (QEMU: -netdev vhost-user with -chardev socket,path=/run/vm0.sock).",
                ),
                (
                    "sudo turbotun vhost-user --socket /run/vm0.sock --device vm0 --queues 4",
                    "Four queue pairs, a thread and a TAP queue each (QEMU: queues=4 on the netdev, mq=on on the device).",
                ),
                (
                    "qemu-system-x86_64 -accel kvm -m 1G -object memory-backend-memfd,id=mem,size=1G,share=on -machine q35,memory-backend=mem -chardev socket,id=vu0,path=/run/vm0.sock -netdev vhost-user,id=net0,chardev=vu0 -device virtio-net-pci,netdev=net0 ...",
                    "QEMU as its front end: the guest's memory must be shared (memory-backend-memfd,share=on). Under TCG (-accel tcg, QEMU 7.2) add vectors=0 to the device: MSI-X on a vhost-user device crashes there.",
                ),
                (
                    "cloud-hypervisor --memory size=1G,shared=on --net vhost_user=true,socket=/run/vm0.sock,num_queues=2 ...",
                    "Cloud Hypervisor as its front end (num_queues counts queues, two per pair: 2N for --queues N).",
                ),
                ("sudo turbotun stats vm0", "Its counters while it runs, guest to TAP and TAP to guest, drops by reason included."),
            ],
            RUNNING,
            &[],
        ),
        "turbotun wg" | "turbotun-wg" => page(
            &[
                ("turbotun wg wg0 && wg setconf wg0 wg0.conf", "Start an endpoint in the background and configure it with wg."),
                ("WG_QUICK_USERSPACE_IMPLEMENTATION=turbotun-wg wg-quick up wg0", "Have wg-quick run it (on a kernel without WireGuard)."),
                ("turbotun wg --queues 2 wg0", "Two queues, each flow on one: sealing for several flows spreads over two cores."),
                ("LOG_LEVEL=verbose turbotun wg -f wg0 --stats-interval 10", "In the foreground, with debug messages and a line of rates every 10 s."),
                ("sudo turbotun stats wg0", "Its counters while it runs, drops by reason included."),
            ],
            WG_EXIT,
            WG_ENV,
        ),
        "turbotun stats" => page(
            &[
                ("sudo turbotun stats", "The counters of every running fwd, tunnel and wg."),
                ("sudo turbotun stats wg0 --json", "One engine's counters as JSON."),
                (
                    "sudo turbotun stats wg0 --peers --sort handshake",
                    "A WireGuard endpoint's peers as `wg show` lists them, with each one's drops, latest handshake first.",
                ),
                (
                    "sudo turbotun stats --prometheus > /var/lib/prometheus/node-exporter/turbotun.prom",
                    "For node_exporter's textfile collector.",
                ),
            ],
            &[
                ("0", "counters printed"),
                ("1", "nothing serves that name, or its socket may not be read by this user (run as root)"),
                USAGE,
            ],
            &[],
        ),
        "turbotun bench" => page(
            &[
                ("turbotun bench --quick", "A quick side-by-side run of the forwarders (a few minutes)."),
                ("turbotun bench --tunnel", "The tunnels: veth, the kernel's VXLAN, turbotun plain and wg, wireguard-go."),
                (
                    "turbotun bench --vhost-user --quick",
                    "turbotun vhost-user against DPDK's vhost backend, and TCP with the guest's TSO (needs dpdk-testpmd).",
                ),
                (
                    "turbotun bench --wg-scale --wg-peers 10000,1000000",
                    "A WireGuard server of many peers: wg setconf, addconf, show dump, memory and idle CPU.",
                ),
                (
                    "turbotun bench --wg-storm --wg-peers 10000",
                    "A handshake storm: 10,000 peers at once, handshakes per CPU-second, a flow through it.",
                ),
            ],
            DONE,
            &[],
        ),
        "turbotun completions" => page(
            &[
                ("turbotun completions bash > /usr/share/bash-completion/completions/turbotun", "bash"),
                ("turbotun completions zsh > /usr/share/zsh/vendor-completions/_turbotun", "zsh"),
                ("turbotun completions fish > /usr/share/fish/vendor_completions.d/turbotun.fish", "fish"),
            ],
            DONE,
            &[],
        ),
        _ => None,
    }
    .map(|page| {
        let notes = if path == "turbotun wg" || path == "turbotun-wg" { WG_NOTES } else { page.notes };
        Page { environment: with_log(page.environment), notes, ..page }
    })
}

/// A command's environment: the log's variables, which every command reads, then its own (a page that names
/// the log's itself, as `turbotun wg` does with WireGuard's meaning, keeps its own words).
fn with_log(own: Vec<(&'static str, &'static str)>) -> Vec<(&'static str, &'static str)> {
    let mut all: Vec<(&'static str, &'static str)> =
        LOG_ENV.iter().filter(|(name, _)| !own.iter().any(|(n, _)| n == name)).copied().collect();
    all.extend(own);
    all
}

/// The `--help` text after the options.
fn after_help(page: &Page) -> String {
    let mut s = String::from("EXAMPLES:\n");
    for (line, what) in page.examples {
        let _ = writeln!(s, "  {line}\n      {what}");
    }
    s.push_str("\nEXIT STATUS:\n");
    for (code, what) in page.exit {
        let _ = writeln!(s, "  {code}  {what}");
    }
    if !page.environment.is_empty() {
        s.push_str("\nENVIRONMENT:\n");
        for (name, what) in &page.environment {
            let _ = writeln!(s, "  {name}\n      {what}");
        }
    }
    for note in page.notes {
        let _ = writeln!(s, "\n{note}");
    }
    s.trim_end().to_string()
}

/// The command with the sections of [`page`] after the options of its `--help`, and of each subcommand's.
pub fn decorate(cmd: Command) -> Command {
    decorate_at(cmd.get_name().to_string(), cmd)
}

fn decorate_at(path: String, mut cmd: Command) -> Command {
    if let Some(page) = page(&path) {
        cmd = cmd.after_long_help(after_help(&page));
    }
    cmd = short_and_long(cmd);
    let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    for name in names {
        let sub_path = format!("{path} {name}");
        cmd = cmd.mut_subcommand(&name, |sub| decorate_at(sub_path, sub));
    }
    cmd
}

/// `-h` one line per option and `--help` the whole text (clap's convention): each option's help, and the
/// command's description, becomes its first sentence for `-h`, the whole staying for `--help` and the manual page.
fn short_and_long(mut cmd: Command) -> Command {
    if let (Some(about), None) = (cmd.get_about().map(|a| a.to_string()), cmd.get_long_about()) {
        let short = first_sentence(&about);
        if short != about {
            cmd = cmd.about(short).long_about(about);
        }
    }
    let ids: Vec<clap::Id> = cmd.get_arguments().map(|a| a.get_id().clone()).collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |arg| match (arg.get_help().map(|h| h.to_string()), arg.get_long_help()) {
            (Some(help), None) if first_sentence(&help) != help => {
                let short = first_sentence(&help);
                arg.help(short).long_help(help)
            }
            _ => arg,
        });
    }
    cmd
}

/// The gist of `text` for `-h`, one line: its first sentence (up to the first period that ends one), cut before a
/// parenthesis or a semicolon that adds detail.
fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let text = match [" (", "; "].iter().filter_map(|cut| text.find(cut)).min() {
        Some(at) => &text[..at],
        None => text,
    };
    let mut from = 0;
    while let Some(at) = text[from..].find(['.', ':']).map(|i| from + i) {
        let next = text[at + 1..].chars().next();
        let before = &text[..at];
        // "e.g." and "i.e." end no sentence, nor does a period inside a word or number (`wg0.conf`, `1.5`).
        let abbreviation = ["e.g", "i.e", "etc", "vs"].iter().any(|a| before.ends_with(a));
        if text.as_bytes()[at] == b'.' && next.map_or(true, char::is_whitespace) && !abbreviation {
            return text[..at].to_string();
        }
        from = at + 1;
    }
    text.to_string()
}

/// The SYNOPSIS: the command, then every option with the value it takes (`[--queues N]`, which clap_mangen's
/// own synopsis leaves out), then the positional arguments and the subcommands.
fn render_synopsis(cmd: &Command, path: &str, out: &mut Vec<u8>) -> std::io::Result<()> {
    let mut words = vec![format!("\\fB{}\\fR", roff(path))];
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let value = arg.get_value_names().and_then(|v| v.first()).map(|v| v.to_string());
        let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
        let flag = match (arg.get_long(), arg.get_short()) {
            (Some(long), _) => format!("\\fB\\-\\-{}\\fR", roff(long)),
            (None, Some(short)) => format!("\\fB\\-{short}\\fR"),
            (None, None) => {
                let name = value.unwrap_or_else(|| arg.get_id().to_string().to_uppercase());
                words.push(if arg.is_required_set() {
                    format!("\\fI{}\\fR", roff(&name))
                } else {
                    format!("[\\fI{}\\fR]", roff(&name))
                });
                continue;
            }
        };
        let value = value.unwrap_or_else(|| arg.get_id().to_string().to_uppercase());
        words.push(match takes_value {
            true => format!("[{flag} \\fI{}\\fR]", roff(&value)),
            false => format!("[{flag}]"),
        });
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        words.push("\\fICOMMAND\\fR".into());
    }
    writeln!(out, ".SH SYNOPSIS\n{}", words.join(" "))
}

/// Text for a roff line: backslashes and hyphens escaped, a leading dot or quote made literal.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

/// One manual page: clap_mangen's sections, then EXAMPLES, EXIT STATUS, ENVIRONMENT and SEE ALSO.
fn render(cmd: &Command, path: &str, see_also: &[String], out: &mut Vec<u8>) -> std::io::Result<()> {
    let man =
        clap_mangen::Man::new(cmd.clone()).manual("turbotun").source(format!("turbotun {}", env!("CARGO_PKG_VERSION")));
    man.render_title(out)?;
    man.render_name_section(out)?;
    render_synopsis(cmd, path, out)?;
    man.render_description_section(out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(out)?;
    }
    if let Some(page) = page(path) {
        writeln!(out, ".SH EXAMPLES")?;
        for (line, what) in page.examples {
            writeln!(out, ".TP\n\\fB{}\\fR\n{}", roff(line), roff(what))?;
        }
        writeln!(out, ".SH \"EXIT STATUS\"")?;
        for (code, what) in page.exit {
            writeln!(out, ".TP\n\\fB{code}\\fR\n{}", roff(what))?;
        }
        if !page.notes.is_empty() {
            writeln!(out, ".SH NOTES")?;
            for note in page.notes {
                writeln!(out, ".PP\n{}", roff(note))?;
            }
        }
        if !page.environment.is_empty() {
            writeln!(out, ".SH ENVIRONMENT")?;
            for (name, what) in &page.environment {
                writeln!(out, ".TP\n\\fB{}\\fR\n{}", roff(name), roff(what))?;
            }
        }
    }
    if !see_also.is_empty() {
        writeln!(
            out,
            ".SH \"SEE ALSO\"\n{}",
            see_also.iter().map(|p| format!("\\fB{}\\fR(1)", roff(p))).collect::<Vec<_>>().join(", ")
        )?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(out)?;
    }
    Ok(())
}

/// Writes the manual pages into `dir`: `turbotun.1`, a `turbotun-COMMAND.1` for each command (and
/// `turbotun-load-gen.1`, ...), and `turbotun-wg.1` for both `turbotun wg` and the `turbotun-wg` program.
pub fn write_man_pages(dir: &Path, turbotun: Command, turbotun_wg: Command) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    // `help` is a subcommand of the command line, not a page: no `turbotun-help(1)` is listed.
    let mut turbotun = without_help_subcommand(turbotun);
    turbotun.build();
    let mut pages: Vec<(String, String, Command)> = Vec::new();
    collect(&turbotun, "turbotun", "turbotun", &mut pages);
    let mut wg = turbotun_wg;
    wg.build();
    pages.push(("turbotun-wg".into(), "turbotun-wg".into(), wg.clone()));
    let names: Vec<String> = pages.iter().map(|(file, _, _)| file.clone()).collect();
    for (file, path, cmd) in pages {
        let see_also: Vec<String> = if file == "turbotun" {
            names.iter().filter(|n| *n != "turbotun").cloned().collect()
        } else {
            let mut also = vec!["turbotun".to_string()];
            if file == "turbotun-wg" {
                also.extend(["wg".to_string(), "wg-quick".to_string()]);
            }
            also
        };
        let mut out = Vec::new();
        render(&cmd, &path, &see_also, &mut out)?;
        let target = dir.join(format!("{file}.1"));
        std::fs::write(&target, out)?;
        written.push(target);
    }
    Ok(written)
}

/// Every visible command under `cmd` with its page's file name and help path; `turbotun wg` is left to the
/// `turbotun-wg` page.
/// `cmd` and its subcommands without clap's `help` subcommand.
fn without_help_subcommand(cmd: Command) -> Command {
    let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    let mut cmd = cmd.disable_help_subcommand(true);
    for name in names {
        cmd = cmd.mut_subcommand(&name, without_help_subcommand);
    }
    cmd
}

fn collect(cmd: &Command, file: &str, path: &str, out: &mut Vec<(String, String, Command)>) {
    out.push((file.to_string(), path.to_string(), cmd.clone()));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let (file, path) = (format!("{file}-{}", sub.get_name()), format!("{path} {}", sub.get_name()));
        if file == "turbotun-wg" {
            continue;
        }
        collect(sub, &file, &path, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_first_sentence_ends_at_a_period_that_ends_one() {
        assert_eq!(first_sentence("Workers per direction. More text."), "Workers per direction");
        assert_eq!(
            first_sentence("Give ADDR:PORT, e.g. 10.0.0.1:5000 or wg0.conf. Then more."),
            "Give ADDR:PORT, e.g. 10.0.0.1:5000 or wg0.conf"
        );
        assert_eq!(first_sentence("One sentence only."), "One sentence only");
        assert_eq!(first_sentence("Become this user (name or uid; more). And more."), "Become this user");
        assert_eq!(first_sentence("No period"), "No period");
    }

    #[test]
    fn test_every_page_lists_the_log_variables_once() {
        for path in ["turbotun fwd", "turbotun features", "turbotun", "turbotun wg"] {
            let env = page(path).unwrap().environment;
            for name in ["LOG_LEVEL", "RUST_LOG"] {
                assert_eq!(env.iter().filter(|(n, _)| *n == name).count(), 1, "{path}: {name}");
            }
        }
        assert!(page("turbotun fwd").unwrap().environment.iter().any(|(n, _)| *n == "TURBOTUN_NO_URING"));
        assert!(!page("turbotun features").unwrap().environment.iter().any(|(_, t)| t.contains("wireguard")));
    }

    #[test]
    fn test_roff_escapes() {
        assert_eq!(roff("a-b\\c"), "a\\-b\\ec");
        assert_eq!(roff(".x"), "\\&.x");
    }
}
