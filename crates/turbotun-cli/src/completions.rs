//! `turbotun completions SHELL`: clap's completion script, and for bash and fish the names clap cannot know:
//! TUN/TAP devices for `info`, `set` and `delete` (asked of `ip -d link`, which follows the network namespace the
//! shell is in, where /sys may not), and the engines serving counters for `stats`.

use clap::Command;

/// Bash: a function around clap's that offers the names, registered in its place.
const BASH_NAMES: &str = r#"
# Device and engine names, which clap's script cannot know.
_turbotun_names() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    if [[ $COMP_CWORD -eq 2 && $cur != -* ]]; then
        case "${COMP_WORDS[1]}" in
            info|set|delete)
                COMPREPLY=($(compgen -W "$(ip -d -o link show 2>/dev/null | awk -F': ' '/ tun type /{print $2}')" -- "$cur"))
                return 0 ;;
            stats)
                COMPREPLY=($(compgen -W "$(ls /run/turbotun 2>/dev/null | sed -n 's/\.stats$//p')" -- "$cur"))
                return 0 ;;
        esac
    fi
    _turbotun "$@"
}
complete -F _turbotun_names -o bashdefault -o default turbotun
"#;

/// Fish: the same names, as conditions on the subcommand.
const FISH_NAMES: &str = r#"
complete -c turbotun -n '__fish_seen_subcommand_from info set delete' -f -a "(ip -d -o link show 2>/dev/null | awk -F': ' '/ tun type /{print \$2}')"
complete -c turbotun -n '__fish_seen_subcommand_from stats' -f -a "(ls /run/turbotun 2>/dev/null | sed -n 's/\.stats\$//p')"
"#;

/// The completion script of `program` (`turbotun` or `turbotun-wg`, whose command line is `cmd`) for `shell`.
pub fn script(shell: clap_complete::Shell, program: &str, cmd: &mut Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, cmd, program, &mut out);
    if program == "turbotun" {
        match shell {
            clap_complete::Shell::Bash => out.extend_from_slice(BASH_NAMES.as_bytes()),
            clap_complete::Shell::Fish => out.extend_from_slice(FISH_NAMES.as_bytes()),
            _ => {}
        }
    }
    out
}
