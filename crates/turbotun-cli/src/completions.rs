//! `turbotun completions SHELL`: clap's completion script, and for bash, zsh and fish the names clap cannot know:
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

/// Zsh: clap's function renamed, and one of its name in front that offers the names first (registered by
/// clap's last lines, or run as the autoloaded `_turbotun` from `fpath`).
const ZSH_NAMES: &str = r#"
# Device and engine names, which clap's script cannot know.
_turbotun() {
    if (( CURRENT == 3 )) && [[ $PREFIX != -* ]]; then
        local -a names
        case $words[2] in
            info|set|delete)
                names=(${(f)"$(ip -d -o link show 2>/dev/null | awk -F': ' '/ tun type /{print $2}')"})
                compadd -a names
                return ;;
            stats)
                names=(${(f)"$(ls /run/turbotun 2>/dev/null | sed -n 's/\.stats$//p')"})
                compadd -a names
                return ;;
        esac
    fi
    _turbotun_clap "$@"
}
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
            clap_complete::Shell::Zsh => out = zsh_with_names(&out),
            _ => {}
        }
    }
    out
}

/// Clap's zsh script with its `_turbotun` renamed `_turbotun_clap` and [`ZSH_NAMES`] put before its last lines
/// (which register or run `_turbotun`). Unchanged if clap's script has no such function (a newer clap's shape).
fn zsh_with_names(clap_script: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(clap_script);
    let Some(tail) = text.rfind("\nif [ \"$funcstack[1]\" = \"_turbotun\" ]") else { return clap_script.to_vec() };
    if !text.contains("\n_turbotun() {\n") {
        return clap_script.to_vec();
    }
    let body = text[..tail].replacen("\n_turbotun() {\n", "\n_turbotun_clap() {\n", 1);
    format!("{body}{ZSH_NAMES}{}", &text[tail..]).into_bytes()
}
