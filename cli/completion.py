"""`gpu-dra completion bash|zsh`: a shell completion script for every command, subcommand and flag.

The script is generated from the parsers themselves, so it always lists what the installed version accepts:
`source <(gpu-dra completion bash)`, or for zsh `source <(gpu-dra completion zsh)` (bash completion through
zsh's bashcompinit).
"""

from __future__ import annotations

import argparse
import shlex


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete for")


def words(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """`path of subcommands` -> what may follow it there: its subcommands, flags and fixed values."""
    table: dict[str, list[str]] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        found: list[str] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found.append(name)
                    walk(child, f"{path} {name}".strip())
            elif action.option_strings:
                found += [s for s in action.option_strings if s.startswith("--") or len(action.option_strings) == 1]
            elif action.choices:
                found += [str(c) for c in action.choices]
        table[path] = sorted(set(found))

    walk(parser, "")
    return table


def bash_script(table: dict[str, list[str]]) -> str:
    cases = "\n".join(f"        {shlex.quote(path or '_')}) opts={shlex.quote(' '.join(options))} ;;"
                      for path, options in sorted(table.items()))
    return f"""# gpu-dra bash completion: source <(gpu-dra completion bash)
_gpu_dra_complete() {{
    local cur path word opts i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    path=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        [[ "$word" == -* ]] && continue
        case "${{path:-_}}" in
{_known_paths(table)}
        esac
    done
    opts=""
    case "${{path:-_}}" in
{cases}
    esac
    COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
    [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=( $(compgen -f -- "$cur") )
    return 0
}}
complete -F _gpu_dra_complete gpu-dra
"""


def _known_paths(table: dict[str, list[str]]) -> str:
    """Bash case arms: a word extends the subcommand path only when it names a subcommand there."""
    arms = []
    for path in sorted(table):
        subs = [w for w in table[path] if f"{path} {w}".strip() in table]
        if subs:
            arms.append(f"            {shlex.quote(path or '_')}) case \"$word\" in {'|'.join(subs)}) "
                        f"path=\"${{path:+$path }}$word\" ;; esac ;;")
    return "\n".join(arms)


def zsh_script(table: dict[str, list[str]]) -> str:
    return ("# gpu-dra zsh completion: source <(gpu-dra completion zsh)\n"
            "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + bash_script(table))


def run(args: argparse.Namespace) -> int:
    from cli.main import build_parser

    table = words(build_parser([], load_all=True))
    print(bash_script(table) if args.shell == "bash" else zsh_script(table), end="")
    return 0
