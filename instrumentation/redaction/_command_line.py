"""Command-line secrets: passwords given to a command as the value of one of its options.

Rule ``cli_password_flag``: :data:`CLI_PASSWORD_PATTERN` finds the command words, then
:func:`cli_password_spans` reads the rest of each shell command for that command's
password options (from its manual), so that elsewhere ``-p`` stays a port (``ssh -p 22``).
:func:`argument_list_spans` reads an argument vector as one command line.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Sequence
from typing import Final

# Commands that take a password as the value of an option (rule cli_password_flag), each
# from the command's manual: (command, ((option, separator from its value), ...)). A
# separator may hold a group ``open``: a quote it opened, which the value then closes.
_SPACED: Final = r"(?:[ \t]+|=)"
# Between the elements of an argument list written as text: ["redis-cli", "-a", "pw"].
_LIST_SEP: Final = r"""["'][ \t]*+,[ \t]*+["']"""
_GLUED_OR_SPACED: Final = r"(?:[ \t]+|=)?"
# Registry credentials user:password: the separator runs up to the password's colon.
_CREDS_SEP: Final = r"""(?:[ \t]+|=)(?P<open>["']?)[^\s:"']{1,256}+:"""
_PASSWORD_OPTIONS: Final[tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = (
    # docker login and the registry clients that copy its options (global options of
    # docker, podman and nerdctl may come before "login").
    (
        r"(?:(?:docker|podman|nerdctl)(?:[ \t]++--?[a-zA-Z][\w\-]{0,31}+"
        r"(?:[ \t=]++[^\s;&|\-][^\s;&|]{0,255}+)?){0,6}+|buildah|skopeo|oras"
        rf"|helm[ \t]++registry|az(?:[ \t]++acr)?)(?:[ \t]++|{_LIST_SEP})login",
        (
            ("-p", _GLUED_OR_SPACED),
            ("--password", _SPACED),
            ("--creds", _CREDS_SEP),
        ),
    ),
    # sshpass: only its own options, before the command it runs (whose -p is a port).
    ("sshpass", (("-p", r"[ \t]*"),)),
    (
        r"mongo(?:sh|dump|restore|export|import|files|stat|top)?",
        (("-p", _GLUED_OR_SPACED), ("--password", _SPACED)),
    ),
    ("redis-cli", (("-a", r"[ \t]+"), ("--pass", _SPACED))),
    ("redis-server", (("--requirepass", _SPACED), ("--masterauth", _SPACED))),
    # Registry credentials user:password (skopeo(1) --src-creds / --dest-creds, podman
    # and buildah --creds): the password after the colon.
    (
        r"(?:skopeo|podman|buildah)",
        (("--(?:src-|dest-)?creds", _CREDS_SEP),),
    ),
    # Glued only: after a separate -p the MySQL client prompts, and the word is the
    # database. The same for 7-Zip's -p.
    (r"(?:mysql|mariadb)(?:[\w\-]{0,24}+)", (("-p", ""),)),
    (r"7z[arz]?", (("-p", ""),)),
    (r"(?:un)?zip", (("-P", r"[ \t]*"),)),
    ("ssh-keygen", (("-[NP]", r"[ \t]*"),)),  # new and old passphrase
    # OpenLDAP clients' bind password; ldappasswd's -s is the new password (elsewhere -s
    # is the search scope).
    ("ldappasswd", (("-w", r"[ \t]*"), ("-s", r"[ \t]*"))),
    (r"ldap[a-z]{0,12}+", (("-w", r"[ \t]*"),)),
    # -k password; -passin / -passout / -pass / -password with the "pass:" source
    # (openssl-passphrase-options(1)); env:, file: and fd: name where the secret is.
    ("openssl", (("-k", r"[ \t]+"), ("-pass(?:in|out|word)?", r"""[ \t]+(?P<open>["']?)pass:"""))),
    (
        r"(?:keytool|jarsigner)",
        (("-(?:src|dest|new)?(?:store|key)?pass", r"[ \t]+"), ("-new", r"[ \t]+")),
    ),
    (
        "smbclient",
        (("-(?:U|-user(?:name)?)", r"""(?:[ \t]*|=)(?P<open>["']?)[^\s%"']{1,256}+%"""),),
    ),
)
# The option's value after a command word, one pattern per command of _PASSWORD_OPTIONS:
# option, then its separator, or (an argument list: ["redis-cli", "-a", "pw"]) the
# option's closing quote, a comma and the value's opening quote.
# Every option starts with "-", which leads the pattern so that re searches for it quickly.
_OPTION_RES: Final = tuple(
    re.compile(
        r"-(?<![\w\-]-)(?:"
        + "|".join(
            (
                rf"(?:{name[1:]})(?:[\"'][ \t]*+,[ \t]*+(?P<lq{i}>[\"'])|{sep})"  # _LIST_SEP
                if sep
                else rf"(?:{name[1:]})"
            )
            for i, (name, sep) in enumerate(options)
        )
        + ")"
    )
    for _, options in _PASSWORD_OPTIONS
)
assert all(name.startswith("-") for _, options in _PASSWORD_OPTIONS for name, _ in options)
# sshpass's own options (sshpass(1)) before the command it runs, also as the elements of
# an argument list (['sshpass', '-p', 'pw', 'ssh', 'h']).
_SSHPASS_ARG: Final = rf"""(?:{_LIST_SEP}[^"'\n]*+|[ \t]*+(?:"[^"\n]*+"|'[^'\n]*+'|[^\s;&|"']++))"""
_SSHPASS_OPTIONS_RE: Final = re.compile(
    rf"""(?:(?:[ \t]++|{_LIST_SEP})(?:-[fdP]{_SSHPASS_ARG}|-[ehvV](?![\w\-])|-p{_SSHPASS_ARG}))*+"""
)
# The rest of a shell command: quoted strings whole (a ; & | in quotes is part of the
# command), backslash escapes (a continued line), and not ; & | a line break, a comment
# (# after a space) or a written \n or \r (text holding an escaped script:
# "cd /app\nmysql -pX").
_COMMAND_REST_RE: Final = re.compile(
    r"""(?:[^"'\\;&|\n \t]++|[ \t]++(?!#)|"(?:[^"\\\n]|\\(?![nr])[^\n])*+"|'[^'\n]*+'"""
    r"""|\\(?![nr])(?:\r\n|[^\r]|\r)|["'])*+"""
)
_COMMAND_START_CHARS: Final = (";", "&", "|", "(", "\n")
# A word: shell escapes (\$) are part of it; a backslash before a quote ends it (\" closes
# a JSON string around the command), as do a backtick and ")" (`cmd -p x`, $(cmd -p x)).
_UNQUOTED_VALUE_RE: Final = re.compile(
    r"(?:\\[^\s\"']|[^\s\"'`)\-;&|<>\\])(?:\\[^\s\"']|[^\s\"'`);&|<>\\])*+"
)
_QUOTE_RE: Final = re.compile(r"\\?[\"']")
# A command word right after one of these is not the command run: a container or host
# name (docker run --name mongo -p 27017:27017, ssh mongo -p 2222, find -name mysql -prune).
_NOT_A_COMMAND_AFTER: Final = frozenset(
    {"--name", "-name", "-iname", "--hostname", "--host", "-h", "--link", "--network", "-z"}
    | {"ssh", "scp", "sftp", "mosh", "nc", "ncat", "netcat", "telnet", "ping", "dig", "host"}
    | {"nslookup", "traceroute", "curl", "wget"}
    # docker and kubectl take a container, pod or resource name there.
    | {"exec", "logs", "rm", "stop", "start", "restart", "kill", "inspect", "attach", "cp"}
    | {"pod", "pods", "sts", "statefulset", "deploy", "deployment", "svc", "service"}
)
# The command words of _PASSWORD_OPTIONS (group c<i>), and echo / printf (group sudo).
CLI_PASSWORD_PATTERN: Final = (
    # Word starts with a command's first letter only: the alternation is tried there alone.
    r"(?:\b|(?<=\\[nt]))(?=[abdehjklmnoprsuz7])"
    r"(?:(?<![\w\-.=:@])|(?<=\\[nt])|(?<=[ \t]@))(?:"
    + "|".join(
        rf"(?P<c{i}>{command})(?=[\s\"'`;&|)]|\\[nt]|$)"
        for i, (command, _) in enumerate(_PASSWORD_OPTIONS)
    )
    + r"|(?P<sudo>(?:echo|printf)\b))"
)
_SSHPASS: Final = next(i for i, (c, _) in enumerate(_PASSWORD_OPTIONS) if c == "sshpass")
_CLI_PASSWORD_RE: Final = re.compile(CLI_PASSWORD_PATTERN)
CLI_PASSWORD_TRIGGERS: Final = (
    *("login", "sshpass", "mongo", "redis-cli", "mysql", "mariadb", "zip", "7z"),
    *("ssh-keygen", "ldap", "openssl", "keytool", "jarsigner", "smbclient", "sudo"),
    *("creds", "redis-server"),
)
# An argument vector worth reading as a command line: an element holds a trigger.
_ARGV_HINT_RE: Final = re.compile("|".join(map(re.escape, CLI_PASSWORD_TRIGGERS)))
# echo or printf into sudo -S (sudo(8), -S, --stdin: the password is read from stdin).
_SUDO_STDIN_RE: Final = re.compile(
    r"""(?:echo(?:[ \t]++-[neE]{1,3}+)?|printf(?:[ \t]++["']?%s(?:\\n)?["']?)?)[ \t]++"""
    r"""(?P<value>\\"[^"\n\\]{1,256}+\\"|"[^"\n\\]{1,256}+(?:\\n)?"|'[^'\n\\]{1,256}+(?:\\n)?'"""
    r"""|"[^"\n]{1,256}+"|'[^'\n]{1,256}+'|[^\s"'|;&\\]{1,256}+)"""
    r"""[ \t]*+\|[ \t]*+sudo\b[^\n;&|]{0,128}?[ \t](?:-[A-Za-z]*S|--stdin)(?![\w\-])"""
)


def cli_password_spans(text: str, commands: re.Pattern[str]) -> list[tuple[int, int]]:
    """Spans of the passwords given to the commands of :data:`_PASSWORD_OPTIONS` in
    ``text`` (rule ``cli_password_flag``), and of values echoed into ``sudo -S``.

    For each command word found by ``commands`` in command position (see
    :func:`_in_command_position`), the rest of its shell command (:func:`_command_end`;
    4,096 characters at most, and on from there if the command goes on) is read for
    every one of the command's password options; a value in quotes (raw or
    JSON-escaped) runs to the same quote on its line, spaces included. A command's
    region is read once however many of its command words it holds, so the whole scan
    is linear in ``len(text)`` (for each of the commands at most).
    """
    spans: list[tuple[int, int]] = []
    # Per command: where its last region ended, and whether only the 4,096 bound ended it.
    scanned: dict[str, tuple[int, bool]] = {}
    for match in commands.finditer(text):
        family = match.lastgroup
        if family is None:
            continue
        if family == "sudo":
            echoed = _SUDO_STDIN_RE.match(text, match.start())
            if echoed is not None:
                start, end = echoed.span("value")
                if text[start] == "\\":
                    start, end = start + 2, end - 2
                elif text[start] in "\"'":
                    start, end = start + 1, end - 1
                spans.append((start, end))
            continue
        region_end, bounded = scanned.get(family, (0, False))
        if match.start() < region_end:
            if not bounded:
                continue
            position = region_end  # the same command, past the bound: read on
        else:
            if not _in_command_position(text, match.start()):
                continue
            position = match.end()
        index = int(family[1:])
        stop, bounded = _command_end(text, position)
        limit = stop
        if index == _SSHPASS and position == match.end():
            # Only sshpass's own options: the command it runs comes next (its -p is a port).
            own = _SSHPASS_OPTIONS_RE.match(text, position, stop)
            limit = own.end() if own is not None else position
        options = _OPTION_RES[index]
        while position < limit:
            option = options.search(text, position, limit)
            if option is None:
                break
            value = _option_value(text, option, limit)
            if value is None:
                position = option.end()
                continue
            spans.append(value)
            position = value[1]
            if position > stop:  # a quoted value ran past the command's end
                stop, bounded = _command_end(text, position)
                limit = position if index == _SSHPASS else stop
        # A bounded region is read on from a little before its end: an option cut by the
        # bound is read whole next time.
        scanned[family] = (max(stop - 256 if bounded else stop, match.end()), bounded)
    return spans


def _command_end(text: str, position: int) -> tuple[int, bool]:
    """Where the shell command going on at ``position`` ends (``;``, ``&``, ``|``, a line
    break no backslash continues, or a written ``\n``; quoted strings are read whole),
    within 4,096 characters; and whether only that bound ended it."""
    bound = min(len(text), position + 4096)
    end = _COMMAND_REST_RE.match(text, position, bound)
    found = end.end() if end is not None else position
    return found, found >= bound and bound < len(text)


def _in_command_position(text: str, start: int) -> bool:
    """Whether the command word at ``start`` is the command run, not an argument of
    another: not inside a volume, URL or option value (``mysql-data:/var/lib/mysql``,
    ``--name=mongo``), not right after an option naming a container or host, nor after a
    command whose next word is a host or a container (``_NOT_A_COMMAND_AFTER``)."""
    chunk = text[max(0, start - 256) : start]
    cut = max(chunk.rfind(c) for c in _COMMAND_START_CHARS)
    escaped = chunk.rfind("\\n")
    if escaped >= 0 and escaped + 1 > cut:
        cut = escaped + 1
    words = chunk[cut + 1 :].split()
    if not words:
        return True
    if not chunk[-1].isspace():  # the last word is the start of the command word's own
        own = words[-1]
        own = own[max(own.rfind(c) for c in "\"'`([{,") + 1 :]  # {"cmd":"docker login
        if ":" in own or "=" in own:
            return False
        words.pop()
        if not words:
            return True
    return words[-1].strip("\"'`([{,").lower() not in _NOT_A_COMMAND_AFTER


def _option_value(text: str, option: re.Match[str], stop: int) -> tuple[int, int] | None:
    """The span of the value after ``option`` (a match of an :data:`_OPTION_RES`
    pattern), or ``None`` when there is none (the next option, the end of the command).
    A quoted value runs to the same quote, or to the end of its line when it never
    closes.
    """
    position = option.end()
    groups = option.groupdict()
    quote = groups.get("open") or next(
        (v for k, v in groups.items() if k.startswith("lq") and v), None
    )
    if not quote:
        opened = _QUOTE_RE.match(text, position)
        if opened is not None:
            if quote_closes(text, position, opened.group(), opened.end()):
                return None  # os.system("mysql -uroot -p" + pw): the string ends there
            quote, position = opened.group(), opened.end()
    if quote:
        close = text.find(quote, position, position + 4096)
        if close < 0:  # rare: then a search to the end, and the value goes as far
            close = text.find(quote, position)
        line_end = text.find("\n", position, close if close >= 0 else len(text))
        if line_end >= 0:
            end = line_end - (text[line_end - 1 : line_end] == "\r")
        else:
            end = close if close >= 0 else len(text)
        return (position, end) if end > position else None
    value = _UNQUOTED_VALUE_RE.match(text, position, stop)
    return value.span() if value is not None else None


def argument_list_spans(items: Sequence[str]) -> dict[int, list[tuple[int, int]]]:
    """Password spans in an argument vector (``["redis-cli", "-a", "pw"]``, OTel's
    ``process.command_args``) read as one command line: ``{element index: [(start, end),
    ...]}``; an element holding JSON-escaped characters is one span whole."""
    if len(items) < 2 or not any(_ARGV_HINT_RE.search(item) for item in items):
        return {}
    offsets: list[int] = []
    parts: list[str] = []
    position = 0
    for item in items:
        quoted = json.dumps(item)
        offsets.append(position + 1)
        parts.append(quoted)
        position += len(quoted) + 2
    line = ", ".join(parts)
    found: dict[int, list[tuple[int, int]]] = {}
    for start, end in cli_password_spans(line, _CLI_PASSWORD_RE):
        index = bisect.bisect_right(offsets, start) - 1
        if index < 0:
            continue
        offset = offsets[index]
        item_end = offset + len(parts[index]) - 2
        if start < item_end and end <= item_end:
            raw = parts[index][1:-1]
            if raw == items[index]:  # no JSON escapes: offsets are the element's
                found.setdefault(index, []).append((start - offset, end - offset))
            else:
                found.setdefault(index, []).append((0, len(items[index])))
    return found


# After a quote that closes a string: a space, ", " "; " "+ ", or a closing bracket.
_AFTER_CLOSING_QUOTE_RE: Final = re.compile(r"\s|[,;+]|[)\]}](?:[\s,;.)\]}]|$)")


def quote_closes(text: str, at: int, quote: str, after: int) -> bool:
    """Whether ``quote`` (``"``, ``'`` or JSON-escaped ``\\"``) at ``at`` closes a string
    rather than opening a value: ``print("password:", pw)``, ``"mysql -p" + pw``.

    Both must hold: an odd number of the same quote before it on its line (within 1,024
    characters: the string it closes opened there; ``DB_PASSWORD=" x"`` has none,
    ``"password": " x"`` two), and what follows at ``after`` is what follows a closing
    quote in code (a space, ``,``, ``;``, ``+``, or a closing bracket before a separator).
    """
    if _AFTER_CLOSING_QUOTE_RE.match(text, after) is None:
        return False
    begin = max(text.rfind("\n", max(0, at - 1024), at) + 1, at - 1024, 0)
    count = text.count(quote, begin, at)
    if not quote.startswith("\\"):
        count -= text.count("\\" + quote, begin, at)
    return count % 2 == 1
