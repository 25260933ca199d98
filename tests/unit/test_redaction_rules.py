"""Redaction rules (``loopwatch.instrumentation.redaction``): tables of cases and laws.

Secret-shaped samples are assembled from pieces so that secret scanners do not flag this
file; none of them is a real credential.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import re
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopwatch.instrumentation import redaction
from loopwatch.instrumentation.redaction import (
    MIN_CANARY_CHARS,
    RedactionRules,
    Redactor,
    RegexCanaryMatcher,
    SecretRule,
    _canaries,
    _command_line,
    _redactor,
    _rules,
    canaries_from_env,
    canary_forms,
    default_redactor,
    is_placeholder,
    load_canaries,
    placeholder,
)

CANARY = "LWCANARY-7f3a9c21-Zq"
CANARY_ODD = 'lw/canary "q" +é&=x'  # needs escaping in JSON and URLs, non-ASCII

OPENAI = "sk-" + "T3BlbkFJ" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0"
OPENAI_PROJ = "sk-proj-" + "Ab3_dE6-" * 8
ANTHROPIC = "sk-ant-api03-" + "xY9_" * 20 + "AA"
GITHUB_PAT = "ghp_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"
GITHUB_OAUTH = "gho_" + "Z" * 36
GITHUB_FINE = "github_pat_" + "11ABCDEFG0" * 2 + "ab_" + "c" * 59
SLACK_BOT = "xoxb-" + "123456789012-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"
GOOGLE = "AIza" + "SyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe"
STRIPE_LIVE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
STRIPE_RESTRICTED = "rk_live_" + "51H4xYz" * 4
JWT = (
    "eyJ"
    + "hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    + ".eyJ"
    + "zdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
    + "."
    + "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_STS = "ASIA" + "Y34FZKBOKMUTVV7A"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
PEM = (
    "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7Mhg\n"
    "dGhpcyBpcyBub3QgYSByZWFsIGtleQ==\n-----END " + "RSA PRIVATE KEY-----"
)
OPENSSH = "-----BEGIN " + "OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
SHA256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"

REDACTOR = Redactor(canaries=[CANARY, CANARY_ODD])


def ph(rule: str) -> str:
    text: str = placeholder(rule)
    return text


# (case id, input, expected output, expected hits)
TEXT_CASES: list[tuple[str, str, str, dict[str, int]]] = [
    (
        "openai legacy",
        f"key={OPENAI[:3]} {OPENAI} end",
        f"key=sk- {ph('openai_key')} end",
        {"openai_key": 1},
    ),
    (
        "openai project",
        f"OPENAI_API_KEY {OPENAI_PROJ}",
        f"OPENAI_API_KEY {ph('openai_key')}",
        {"openai_key": 1},
    ),
    ("anthropic", f"x-api {ANTHROPIC}.", f"x-api {ph('anthropic_key')}.", {"anthropic_key": 1}),
    ("github classic", f"token {GITHUB_PAT}", f"token {ph('github_token')}", {"github_token": 1}),
    ("github oauth", f"({GITHUB_OAUTH})", f"({ph('github_token')})", {"github_token": 1}),
    ("github fine-grained", GITHUB_FINE, ph("github_token"), {"github_token": 1}),
    ("slack", f"slack:{SLACK_BOT}", f"slack:{ph('slack_token')}", {"slack_token": 1}),
    ("google", f"maps?k {GOOGLE} x", f"maps?k {ph('google_api_key')} x", {"google_api_key": 1}),
    ("stripe live", f"charge {STRIPE_LIVE}", f"charge {ph('stripe_key')}", {"stripe_key": 1}),
    ("stripe restricted", STRIPE_RESTRICTED, ph("stripe_key"), {"stripe_key": 1}),
    ("jwt", f"id_jwt {JWT} done", f"id_jwt {ph('jwt')} done", {"jwt": 1}),
    ("aws access key", f"id {AWS_ID}.", f"id {ph('aws_access_key')}.", {"aws_access_key": 1}),
    ("aws sts key", f"[{AWS_STS}]", f"[{ph('aws_access_key')}]", {"aws_access_key": 1}),
    (
        "aws secret in context",
        f'aws_secret_access_key = "{AWS_SECRET}"',
        f'aws_secret_access_key = "{ph("aws_secret_key")}"',
        {"aws_secret_key": 1},
    ),
    (
        "aws secret camel",
        f"SecretAccessKey: {AWS_SECRET}",
        f"SecretAccessKey: {ph('aws_secret_key')}",
        {"aws_secret_key": 1},
    ),
    ("pem block", f"key:\n{PEM}\nafter!", f"key:\n{ph('private_key')}\nafter!", {"private_key": 1}),
    ("pem truncated", f"{OPENSSH}", ph("private_key"), {"private_key": 1}),
    (
        "bearer header",
        "curl -H 'Authorization: Bearer abc123def456ghi789jk'",
        f"curl -H 'Authorization: Bearer {ph('bearer')}'",
        {"bearer": 1},
    ),
    (
        "bearer anywhere",
        "sent bearer 9f8e7d6c5b4a39281706 ok",
        f"sent bearer {ph('bearer')} ok",
        {"bearer": 1},
    ),
    (
        "authorization without digits",
        "Authorization: Basic dXNlcnBhc3N3b3Jk",
        f"Authorization: Basic {ph('assignment')}",
        {"assignment": 1},
    ),
    (
        "url password",
        "postgres://app:s3cr%40t@db:5432/orders",
        f"postgres://app:{ph('url_password')}@db:5432/orders",
        {"url_password": 1},
    ),
    (
        "assignment query",
        "GET /login?user=bob&password=hunter2&next_page_token=p2",
        f"GET /login?user=bob&password={ph('assignment')}&next_page_token=p2",
        {"assignment": 1},
    ),
    (
        "assignment prefixed key",
        "DB_PASSWORD=hunter2 ./run",
        f"DB_PASSWORD={ph('assignment')} ./run",
        {"assignment": 1},
    ),
    ("assignment camel", "apiKey: abcdef", f"apiKey: {ph('assignment')}", {"assignment": 1}),
    (
        "assignment escaped json",
        'msg="{\\"client_secret\\":\\"s3\\"}"',
        f'msg="{{\\"client_secret\\":\\"{ph("assignment")}\\"}}"',
        {"assignment": 1},
    ),
    (
        # A quoted value runs on to its closing quote: passphrases have spaces.
        "assignment quoted with spaces",
        "export DB_PASSWORD=\"correct horse battery\" && run; password: 'a b c'\nuser: bob",
        f"export DB_PASSWORD=\"{ph('assignment')}\" && run; password: '{ph('assignment')}'\nuser: bob",
        {"assignment": 2},
    ),
    (
        "cli flag quoted with spaces",
        "mysql --password \"correct horse\" -h db; run --api-key='a b' --region eu",
        f"mysql --password \"{ph('assignment')}\" -h db; run --api-key='{ph('assignment')}' --region eu",
        {"assignment": 2},
    ),
    (
        # The other quote character is part of the value; an unclosed quote runs on to
        # the end of the line.
        "assignment quoted, other quote inside, unclosed",
        "password=\"it's mine\" ok; token='never closed\nnext line",
        f'password="{ph("assignment")}" ok; token=\'{ph("assignment")}\nnext line',
        {"assignment": 2},
    ),
    (
        "assignment escaped json with spaces",
        'msg="{\\"password\\":\\"a b c\\",\\"user\\":\\"bob\\"}"',
        f'msg="{{\\"password\\":\\"{ph("assignment")}\\",\\"user\\":\\"bob\\"}}"',
        {"assignment": 1},
    ),
    (
        "assignment quoted allowed key",
        'next_page_token="a b" password=""',
        'next_page_token="a b" password=""',
        {},
    ),
    (
        "assignment ruby hash",
        '{"password" => "hunter2", "user" => "bob"}',
        f'{{"password" => "{ph("assignment")}", "user" => "bob"}}',
        {"assignment": 1},
    ),
    (
        "assignment php array",
        "['api_key' => 'abc123']",
        f"['api_key' => '{ph('assignment')}']",
        {"assignment": 1},
    ),
    (
        "assignment url-encoded form",
        "body=user%3Dbob%26password%3Dhunter2",
        f"body=user%3Dbob%26password%3D{ph('assignment')}",
        {"assignment": 1},
    ),
    (
        # Over-redaction is the safe side: the value runs on to a raw separator.
        "assignment url-encoded json",
        "q=%7B%22token%22%3A%22abc%22%7D&x=1",
        f"q=%7B%22token%22%3A%22{ph('assignment')}&x=1",
        {"assignment": 1},
    ),
    (
        # A query inside a URL inside a query (a nested redirect) is encoded twice.
        "assignment url-encoded twice",
        "next=%2Fcb%253Fuser%253Dbob%2526password%253Dhunter2&q=%2522token%2522%253A%2522ab%2522",
        f"next=%2Fcb%253Fuser%253Dbob%2526password%253D{ph('assignment')}"
        f"&q=%2522token%2522%253A%2522{ph('assignment')}",
        {"assignment": 2},
    ),
    (
        "assignment url-encoded allowed key",
        "q=x%26next_page_token%3Dp2",
        "q=x%26next_page_token%3Dp2",
        {},
    ),
    (
        "cli flag",
        "mysqldump --password hunter2 orders",
        f"mysqldump --password {ph('assignment')} orders",
        {"assignment": 1},
    ),
    (
        "cli flag with a prefix",
        "deploy --db-password 's3cr3t' --api-key abc123 --region eu",
        f"deploy --db-password '{ph('assignment')}' --api-key {ph('assignment')} --region eu",
        {"assignment": 2},
    ),
    (
        # gflags / absl and many scripts spell flags with underscores.
        "cli flag with an underscore prefix",
        "serve --db_password hunter2 --api_token abc123",
        f"serve --db_password {ph('assignment')} --api_token {ph('assignment')}",
        {"assignment": 2},
    ),
    (
        # Dotted flags: Spring Boot, Helm, many config loaders (--db.password x).
        "cli flag with a dotted prefix",
        "app --db.password hunter2 --log.level debug --spring.datasource.password=s3",
        f"app --db.password {ph('assignment')} --log.level debug "
        f"--spring.datasource.password={ph('assignment')}",
        {"assignment": 2},
    ),
    (
        "curl user",
        "curl -u alice:s3cret https://api.example.com",
        f"curl -u alice:{ph('cli_password')} https://api.example.com",
        {"cli_password": 1},
    ),
    (
        "curl user glued and quoted",
        "curl -ualice:s3cret x; curl --user 'bob:pa55' y; curl -U proxy:pw3 z",
        f"curl -ualice:{ph('cli_password')} x; curl --user 'bob:{ph('cli_password')}' y; "
        f"curl -U proxy:{ph('cli_password')} z",
        {"cli_password": 3},
    ),
    (
        # curl reads -su alice:pw as -s -u alice:pw (short options combine).
        "curl user after combined short options",
        "curl -su alice:s3cret x; curl -kSu 'bob:pa55' y",
        f"curl -su alice:{ph('cli_password')} x; curl -kSu 'bob:{ph('cli_password')}' y",
        {"cli_password": 2},
    ),
    (
        # The password option of the commands whose option it is.
        "cli password flag",
        "docker login -u bob -p s3cret1 ghcr.io; az login -u a -p=s3cret2\n"
        "sshpass -p s3cret3 ssh h; sshpass -ps3cret4 ssh h\n"
        "mongosh -u app -p 's3cret5' db; redis-cli -h r -p 6379 -a s3cret6 ping\n"
        "mysql -uroot -ps3cret7 orders; mysqldump -u app -p's3cret8' --all-databases",
        f"docker login -u bob -p {ph('cli_password_flag')} ghcr.io; "
        f"az login -u a -p={ph('cli_password_flag')}\n"
        f"sshpass -p {ph('cli_password_flag')} ssh h; sshpass -p{ph('cli_password_flag')} ssh h\n"
        f"mongosh -u app -p '{ph('cli_password_flag')}' db; "
        f"redis-cli -h r -p 6379 -a {ph('cli_password_flag')} ping\n"
        f"mysql -uroot -p{ph('cli_password_flag')} orders; "
        f"mysqldump -u app -p'{ph('cli_password_flag')}' --all-databases",
        {"cli_password_flag": 8},
    ),
    (
        # Archive, key, directory and TLS tools: the password option of each.
        "cli password flag of archive, key and directory tools",
        "zip -P s3cret1 a.zip f; unzip -P s3cret2 a.zip; 7z a -ps3cret3 a.7z f\n"
        "ssh-keygen -t ed25519 -N s3cret4 -f k; ldapsearch -x -D cn=admin -w s3cret5\n"
        "openssl pkcs12 -in a.p12 -passin pass:s3cret6 -out a.pem; openssl enc -k s3cret7\n"
        "keytool -list -keystore k.jks -storepass s3cret8; smbclient //h/s -U bob%s3cret9\n"
        'echo "s3cret10" | sudo -S apt-get install x',
        f"zip -P {ph('cli_password_flag')} a.zip f; unzip -P {ph('cli_password_flag')} a.zip; "
        f"7z a -p{ph('cli_password_flag')} a.7z f\n"
        f"ssh-keygen -t ed25519 -N {ph('cli_password_flag')} -f k; "
        f"ldapsearch -x -D cn=admin -w {ph('cli_password_flag')}\n"
        f"openssl pkcs12 -in a.p12 -passin pass:{ph('cli_password_flag')} -out a.pem; "
        f"openssl enc -k {ph('cli_password_flag')}\n"
        f"keytool -list -keystore k.jks -storepass {ph('cli_password_flag')}; "
        f"smbclient //h/s -U bob%{ph('cli_password_flag')}\n"
        f'echo "{ph("cli_password_flag")}" | sudo -S apt-get install x',
        {"cli_password_flag": 10},
    ),
    (
        # Where the secret is, not the secret; a prompt; no password.
        "cli password flag of archive, key and directory tools left alone",
        'ssh-keygen -N "" -f k; ldapsearch -x -W; openssl rsa -passin file:pw -passout env:PW\n'
        "zip -r a.zip d; tar c d | gzip -k; 7z x a.7z -o/tmp; keytool -list -storepass:env PW\n"
        'smbclient -L h -N; echo "done" | sudo tee /etc/x; unzip -l a.zip',
        'ssh-keygen -N "" -f k; ldapsearch -x -W; openssl rsa -passin file:pw -passout env:PW\n'
        "zip -r a.zip d; tar c d | gzip -k; 7z x a.7z -o/tmp; keytool -list -storepass:env PW\n"
        'smbclient -L h -N; echo "done" | sudo tee /etc/x; unzip -l a.zip',
        {},
    ),
    (
        "netrc",
        "machine api.example.com\n  login bob\n  password s3cret1\n"
        "default login anonymous password s3cret2",
        f"machine api.example.com\n  login bob\n  password {ph('netrc_password')}\n"
        f"default login anonymous password {ph('netrc_password')}",
        {"netrc_password": 2},
    ),
    (
        "aws cli configure",
        f"aws configure set aws_secret_access_key {AWS_SECRET}; aws configure set region eu",
        f"aws configure set aws_secret_access_key {ph('aws_secret_key')}; "
        "aws configure set region eu",
        {"aws_secret_key": 1},
    ),
    (
        # Elsewhere -p is a port or another option: ssh, psql, docker run, redis-cli's
        # -p, tar; a separate word after mysql's -p is the database (it prompts), and
        # a command on an earlier line or before ; & | does not reach the next one.
        "cli password flag left alone",
        "ssh -p 2222 h; psql -h db -p 5432 app; docker run -p 8080:80 img; tar -pczf x d\n"
        "mysql -h db -P 3306 -u root -p orders; mongosh -u app -p --quiet\n"
        "docker login ghcr.io && docker run -p 80:80 x; mongod --port 27017\n"
        "redis-cli -p 6379 ping",
        "ssh -p 2222 h; psql -h db -p 5432 app; docker run -p 8080:80 img; tar -pczf x d\n"
        "mysql -h db -P 3306 -u root -p orders; mongosh -u app -p --quiet\n"
        "docker login ghcr.io && docker run -p 80:80 x; mongod --port 27017\n"
        "redis-cli -p 6379 ping",
        {},
    ),
    (
        "assignment of a glued well-known name",
        "PGPASSWORD=s3cret psql -h db; SSHPASS='a b' sshpass -e ssh h; PGPASSFILE=/x/.pgpass",
        f"PGPASSWORD={ph('assignment')} psql -h db; SSHPASS='{ph('assignment')}' sshpass -e "
        "ssh h; PGPASSFILE=/x/.pgpass",
        {"assignment": 2},
    ),
    # -u / --user take user[:group] (docker, podman, sudo, pgrep) or a time (at, date -u)
    # outside curl: a uid:gid or a group is not a password.
    (
        "docker uid:gid",
        "docker run -u 1000:1000 img; docker exec --user=root:root c sh; at -u 12:30",
        "docker run -u 1000:1000 img; docker exec --user=root:root c sh; at -u 12:30",
        {},
    ),
    ("date -u format", "date -u +%H:%M:%S", "date -u +%H:%M:%S", {}),
    (
        "cli flag of an allowed name",
        "list --page-token p2 --next-page-token=p3",
        "list --page-token p2 --next-page-token=p3",
        {},
    ),
    ("git push -u", "git push -u origin main", "git push -u origin main", {}),
    ("pip --user", "pip install --user requests", "pip install --user requests", {}),
    ("password-stdin", "login --password-stdin < f", "login --password-stdin < f", {}),
    (
        # A flag that takes no value (psql -W / --password prompts) is followed by the
        # next option, not by a secret.
        "cli flag without a value",
        "psql --no-password -h db -U app; psql --password -d app; login --token - < f",
        "psql --no-password -h db -U app; psql --password -d app; login --token - < f",
        {},
    ),
    ("canary raw", f"leak {CANARY}!", f"leak {ph('canary')}!", {"canary": 1}),
    (
        "two kinds",
        f"{CANARY} {AWS_ID}",
        f"{ph('canary')} {ph('aws_access_key')}",
        {"canary": 1, "aws_access_key": 1},
    ),
    # Not secrets: left exactly as they are.
    ("sha256 digest", SHA256, SHA256, {}),
    ("prefixed digest", f"sha256:{SHA256}", f"sha256:{SHA256}", {}),
    ("trace and span ids", f"{TRACE_ID}-{SPAN_ID}", f"{TRACE_ID}-{SPAN_ID}", {}),
    ("uuid", "0b6f3c9e-5a4d-4c1b-9e8f-7a6b5c4d3e2f", "0b6f3c9e-5a4d-4c1b-9e8f-7a6b5c4d3e2f", {}),
    (
        "prose bearer",
        "the bearer instruments were signed",
        "the bearer instruments were signed",
        {},
    ),
    ("prose tokens", "tokens: 3 counted", "tokens: 3 counted", {}),
    (
        "disk- is not sk-",
        "disk-abcdefghijklmnopqrstuvwxyz0123",
        "disk-abcdefghijklmnopqrstuvwxyz0123",
        {},
    ),
    (
        "url without password",
        "https://user@example.com:8443/a?b=c",
        "https://user@example.com:8443/a?b=c",
        {},
    ),
    ("port is not a password", "http://host:8080/path@x", "http://host:8080/path@x", {}),
    ("pagination cursor", "next_page_token=CAUQAA", "next_page_token=CAUQAA", {}),
    ("tool name", "search_orders", "search_orders", {}),
    ("empty", "", "", {}),
]


@pytest.mark.parametrize(
    ("text", "expected", "hits"), [c[1:] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES]
)
def test_redact_text(text: str, expected: str, hits: dict[str, int]) -> None:
    out, got = REDACTOR.redact_text(text)
    assert out == expected
    assert got == hits
    again, more = REDACTOR.redact_text(out)
    assert (again, more) == (out, {})


def _b64_embedded(canary: str, offset: int, *, urlsafe: bool = False, pad: bool = True) -> str:
    payload = bytes(range(offset)) + canary.encode() + b"\xfe\xff:suffix"
    encoded = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(payload).decode()
    return encoded if pad else encoded.rstrip("=")


# (case id, text holding the canary in some encoding)
CANARY_FORM_CASES: list[tuple[str, str, str]] = [
    ("raw", CANARY, f"a {CANARY} b"),
    ("json escaped", CANARY_ODD, json.dumps({"v": CANARY_ODD})),
    ("json ascii escaped", CANARY_ODD, json.dumps(CANARY_ODD)[1:-1]),
    ("json unicode kept", CANARY_ODD, json.dumps(CANARY_ODD, ensure_ascii=False)[1:-1]),
    ("json slash escaped", CANARY_ODD, json.dumps(CANARY_ODD)[1:-1].replace("/", "\\/")),
    ("json double escaped", CANARY_ODD, "x " + json.dumps(json.dumps({"v": CANARY_ODD}))),
    ("url quote", CANARY_ODD, "https://x.test/" + urllib.parse.quote(CANARY_ODD)),
    ("url quote safe none", CANARY_ODD, "q=" + urllib.parse.quote(CANARY_ODD, safe="")),
    ("url quote_plus", CANARY_ODD, "q=" + urllib.parse.quote_plus(CANARY_ODD) + "&x=1"),
    ("url lowercase hex", CANARY_ODD, urllib.parse.quote(CANARY_ODD, safe="").lower()),
    ("base64", CANARY, base64.b64encode(CANARY.encode()).decode()),
    ("base64 unpadded", CANARY_ODD, base64.b64encode(CANARY_ODD.encode()).decode().rstrip("=")),
    ("base64url", CANARY_ODD, base64.urlsafe_b64encode(CANARY_ODD.encode()).decode()),
    ("base64 embedded +0", CANARY, _b64_embedded(CANARY, 0)),
    ("base64 embedded +1", CANARY, _b64_embedded(CANARY, 1)),
    ("base64 embedded +2", CANARY, _b64_embedded(CANARY, 2)),
    ("base64url embedded +1", CANARY_ODD, _b64_embedded(CANARY_ODD, 1, urlsafe=True, pad=False)),
    ("base64url embedded +2", CANARY_ODD, _b64_embedded(CANARY_ODD, 2, urlsafe=True)),
]


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _decodings(text: str) -> set[str]:
    out = {urllib.parse.unquote(text), urllib.parse.unquote_plus(text)}
    literals = re.findall(r'"(?:[^"\\]|\\.)*"', text)
    for candidate in (text, f'"{text}"', *literals):
        with contextlib.suppress(ValueError):
            out.update(_strings(json.loads(candidate)))
    for fragment in re.split(r"\[REDACTED:[^\]]*\]|[^A-Za-z0-9+/=_-]", text):
        for start in range(4):
            chunk = fragment[start:].rstrip("=")
            for decode in (base64.b64decode, base64.urlsafe_b64decode):
                with contextlib.suppress(ValueError):
                    out.add(decode(chunk + "=" * (-len(chunk) % 4)).decode("latin-1"))
    return out


def _leaks(canary: str, text: str) -> bool:
    """Independent leak check: decode the text every way a case can encode, 3 levels deep."""
    seen, frontier = {text}, {text}
    for _ in range(3):
        frontier = {d for t in frontier for d in _decodings(t)} - seen
        seen |= frontier
    needles = {canary, canary.encode().decode("latin-1")}
    return any(n in c for n in needles for c in seen)


@pytest.mark.parametrize(
    ("canary", "text"), [c[1:] for c in CANARY_FORM_CASES], ids=[c[0] for c in CANARY_FORM_CASES]
)
def test_canary_forms_are_redacted(canary: str, text: str) -> None:
    assert _leaks(canary, text), "the case must really hide the canary"
    out, hits = REDACTOR.redact_text(text)
    assert hits.get("canary", 0) >= 1
    assert not _leaks(canary, out)
    assert REDACTOR.redact_text(out) == (out, {})


def test_canary_in_invalid_utf8_bytes() -> None:
    value = b"\xff\xfe" + CANARY_ODD.encode() + b"\x80"
    out = REDACTOR.redact_value(value)
    assert isinstance(out, bytes)
    assert CANARY_ODD.encode() not in out
    assert out.startswith(b"\xff\xfe") and out.endswith(b"\x80")


def test_canary_forms_cover_every_alignment_and_are_long_enough() -> None:
    forms = canary_forms(CANARY)
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + CANARY.encode() + b"!").decode()
        assert any(f in encoded for f in forms if f != CANARY)
    assert min(len(f) for f in forms) >= MIN_CANARY_CHARS


# (case id, key, sensitive?)
KEY_CASES: list[tuple[str, str, bool]] = [
    ("password", "password", True),
    ("dotted", "db.password", True),
    ("header authorization", "http.request.header.authorization", True),
    ("header x-api-key", "http.request.header.x-api-key", True),
    ("set-cookie", "http.response.header.set-cookie", True),
    ("camel", "clientSecret", True),
    ("upper camel", "XApiKey", True),
    ("screaming", "AWS_SECRET_ACCESS_KEY", True),
    ("apikey", "apikey", True),
    ("suffix token", "github_token", True),
    ("no separators", "ACCESSTOKEN", True),
    ("private key", "private_key", True),
    ("libpq variable", "PGPASSWORD", True),
    ("sshpass variable", "SSHPASS", True),
    ("libpq password file is a path", "PGPASSFILE", False),
    ("pagination", "nextPageToken", False),
    ("token type", "token_type", False),
    ("usage tokens", "gen_ai.usage.input_tokens", False),
    ("token count", "token_count", False),
    ("tool name", "gen_ai.tool.name", False),
    ("fingerprint", "loopwatch.action.fingerprint", False),
    ("loopwatch exempt", "loopwatch.secret", False),
    ("password hash is not a password", "password.hash", False),
    ("bypass", "bypass", False),
]


@pytest.mark.parametrize(
    ("key", "sensitive"), [c[1:] for c in KEY_CASES], ids=[c[0] for c in KEY_CASES]
)
def test_key_names(key: str, sensitive: bool) -> None:
    assert RedactionRules().key_is_sensitive(key) is sensitive
    out = REDACTOR.redact_value({key: "v4lue"})
    assert out == ({key: ph("sensitive_key")} if sensitive else {key: "v4lue"})


def test_value_under_sensitive_key_is_replaced_whole_and_scalars_kept() -> None:
    value = {
        "password": {"nested": ["a", 1]},
        "token": 12345,
        "cookie": None,
        "secret": "",
        "api_key": True,
        "auth_token": b"raw",
    }
    hits: dict[str, int] = {}
    out = REDACTOR.scrub_value(value, hits)
    assert out == {
        "password": ph("sensitive_key"),
        "token": ph("sensitive_key"),
        "cookie": None,
        "secret": "",
        "api_key": True,
        "auth_token": ph("sensitive_key").encode(),
    }
    assert value["password"] == {"nested": ["a", 1]}, "input not mutated"
    assert hits == {"sensitive_key": 3}


def test_canary_under_sensitive_key_counts_as_canary() -> None:
    hits: dict[str, int] = {}
    out = REDACTOR.scrub_value({"password": f"x{CANARY}"}, hits)
    assert out == {"password": ph("canary")}
    assert hits == {"canary": 1}


def test_structural_values_untouched() -> None:
    attrs = {
        "loopwatch.action.fingerprint": SHA256,
        "loopwatch.observation.digest": SHA256[::-1],
        "loopwatch.run.id": "0b6f3c9e-5a4d-4c1b-9e8f-7a6b5c4d3e2f",
        "gen_ai.tool.name": "search_orders",
        "gen_ai.tool.call.id": "call_Ab12Cd34Ef56Gh78Ij90Kl12",
        "gen_ai.usage.input_tokens": 1200,
    }
    hits: dict[str, int] = {}
    assert REDACTOR.scrub_value(attrs, hits) is attrs
    assert hits == {}


def test_json_inside_strings_is_parsed_redacted_and_reserialized() -> None:
    inner = json.dumps({"headers": {"Authorization": "Bearer abc"}, "q": "ok"})
    args = json.dumps({"url": "https://api.test", "config": inner, "password": "hunter2"}, indent=2)
    out, hits = REDACTOR.redact_text(args)
    assert json.loads(out) == {
        "url": "https://api.test",
        "config": json.dumps(
            {"headers": {"Authorization": ph("sensitive_key")}, "q": "ok"}, separators=(",", ":")
        ),
        "password": ph("sensitive_key"),
    }
    assert "\n" not in out, "re-serialized compactly"
    assert hits == {"sensitive_key": 2}


def test_clean_json_is_not_reformatted() -> None:
    text = json.dumps({"b": 1, "a": ["x", {"token_count": 3}]}, indent=2)
    assert REDACTOR.redact_text(text) == (text, {})
    escaped = '{"name": "caf\\u00e9", "path": "a\\/b"}'
    assert REDACTOR.redact_text(escaped) == (escaped, {})


def test_json_unicode_escapes_do_not_hide_keys() -> None:
    text = '{"\\u0070assword": "hunter2"}'
    out, hits = REDACTOR.redact_text(text)
    assert json.loads(out) == {"password": ph("sensitive_key")}
    assert hits == {"sensitive_key": 1}


def test_canary_split_across_json_structure_is_still_redacted() -> None:
    canary = 'lw-canary","part-two'
    redactor = Redactor(canaries=[canary])
    out, hits = redactor.redact_text('["lw-canary","part-two"]')
    assert hits.get("canary") == 1
    assert "part-two" not in out


def test_nesting_deeper_than_the_bound_is_replaced_whole() -> None:
    rules = RedactionRules(max_json_depth=4)
    redactor = Redactor(rules)
    value = {"a": {"b": {"c": {"d": {"e": "x"}}}}}
    hits: dict[str, int] = {}
    assert redactor.scrub_value(value, hits) == {"a": {"b": {"c": {"d": ph("depth")}}}}
    assert hits == {"depth": 1}
    text = json.dumps({"a": {"b": {"c": {"d": {"e": "token=x"}}}}})
    out, _ = redactor.redact_text(text)
    assert json.loads(out) == {"a": {"b": {"c": ph("depth")}}}, "string counts as one level"
    assert redactor.redact_text(out) == (out, {})


def test_hmac_mode_correlates_without_revealing() -> None:
    key = b"k" * 32
    redactor = Redactor(hmac_key=key, canaries=[CANARY])
    out, hits = redactor.redact_text(f"{AWS_ID} {AWS_ID} {AWS_STS} {CANARY}")
    assert hits == {"aws_access_key": 3, "canary": 1}
    tags = re.findall(r"\[REDACTED:(\w+):([0-9a-f]{8})\]", out)
    assert [t[0] for t in tags] == ["aws_access_key"] * 3 + ["canary"]
    assert tags[0][1] == tags[1][1] != tags[2][1]
    assert AWS_ID not in out and CANARY not in out
    other = Redactor(hmac_key=b"x" * 32).redact_text(AWS_ID)[0]
    assert other != placeholder("aws_access_key", tags[0][1])
    assert redactor.redact_text(out) == (out, {})
    assert redactor.redact_value({"password": "a"}) != redactor.redact_value({"password": "b"})
    assert "k" * 32 not in repr(redactor)


def test_placeholders_never_match_a_rule() -> None:
    redactor = Redactor(canaries=[CANARY], hmac_key=b"0" * 16)
    for name in redactor.rule_names:
        for text in (placeholder(name), placeholder(name, "0a1b2c3d")):
            assert is_placeholder(text)
            for wrapped in (
                text,
                f"x={text}",
                f"{name}: {text}",
                f"://u:{text}@h",
                f'"{name}":"{text}"',
            ):
                assert redactor.redact_text(wrapped) == (wrapped, {}), wrapped


def test_allowed_values_win_over_patterns_but_not_canaries() -> None:
    rules = RedactionRules(allowed_values=(r"AKIA[A-Z0-9]*EXAMPLE",))
    redactor = Redactor(rules, canaries=[CANARY])
    assert redactor.redact_text(f"id {AWS_ID}") == (f"id {AWS_ID}", {})
    assert redactor.redact_text(AWS_STS)[1] == {"aws_access_key": 1}
    assert redactor.redact_value({"token": AWS_ID}) == {"token": AWS_ID}


def test_custom_rule() -> None:
    rule = SecretRule("internal_key", r"ik_(?P<secret>[0-9a-f]{12})", ("ik_",))
    redactor = Redactor(RedactionRules(secret_rules=(*redaction.BUILTIN_SECRET_RULES, rule)))
    assert redactor.redact_text("ik_0123456789ab") == (
        f"ik_{ph('internal_key')}",
        {"internal_key": 1},
    )
    assert "internal_key" in redactor.rule_names


# (case id, constructor, expected message fragment)
INVALID_CONFIG: list[tuple[str, object, str]] = [
    (
        "bad rule name",
        lambda: RedactionRules(secret_rules=(SecretRule("Bad", "x", ("x",)),)),
        "rule name",
    ),
    (
        "reserved name",
        lambda: RedactionRules(secret_rules=(SecretRule("canary", "x", ("x",)),)),
        "reserved",
    ),
    (
        "duplicate",
        lambda: RedactionRules(
            secret_rules=(SecretRule("a", "x", ("x",)), SecretRule("a", "y", ("y",)))
        ),
        "duplicated",
    ),
    ("no trigger", lambda: RedactionRules(secret_rules=(SecretRule("a", "x", ()),)), "trigger"),
    (
        "upper trigger",
        lambda: RedactionRules(secret_rules=(SecretRule("a", "x", ("X",), True),)),
        "lowercase",
    ),
    ("bad regex", lambda: RedactionRules(secret_rules=(SecretRule("a", "(", ("(",)),)), "compile"),
    ("empty match", lambda: RedactionRules(secret_rules=(SecretRule("a", "x*", ("x",)),)), "empty"),
    ("key not normalized", lambda: RedactionRules(key_names=("Api-Key",)), "normalized"),
    ("depth", lambda: RedactionRules(max_json_depth=0), "max_json_depth"),
    ("bad allowed value", lambda: RedactionRules(allowed_values=("[",)), "allowed value"),
    ("short canary", lambda: Redactor(canaries=["short"]), "at least"),
    ("canary with newline", lambda: Redactor(canaries=["abcdefgh\nij"]), "line break"),
    ("canary inside placeholder", lambda: Redactor(canaries=["xREDACTED:"]), "placeholder"),
    ("short hmac key", lambda: Redactor(hmac_key=b"short"), "hmac_key"),
]


@pytest.mark.parametrize(
    ("build", "fragment"), [c[1:] for c in INVALID_CONFIG], ids=[c[0] for c in INVALID_CONFIG]
)
def test_invalid_config_fails_fast(build: object, fragment: str) -> None:
    assert callable(build)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        build()


def test_load_canaries(tmp_path: Path) -> None:
    path = tmp_path / "canaries.txt"
    path.write_text(
        f"# planted 2026-11-30\n\n  {CANARY}  \n#{CANARY_ODD}\nvalue#with-hash\n{CANARY}\n"
    )
    assert load_canaries(path) == (CANARY, "value#with-hash")
    assert canaries_from_env({"LOOPWATCH_REDACTION_CANARIES": str(path)}) == (
        CANARY,
        "value#with-hash",
    )
    assert canaries_from_env({}) == ()


def test_canary_file_errors_never_echo_the_value(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("# ok\nsecret1\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: a canary must be at least") as info:
        load_canaries(path)
    assert "secret1" not in str(info.value)
    with pytest.raises(ValueError, match="cannot read canary file"):
        load_canaries(tmp_path / "missing.txt")


def test_default_redactor_uses_env_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.txt"
    path.write_text(CANARY + "\n")
    monkeypatch.setenv("LOOPWATCH_REDACTION_CANARIES", str(path))
    assert default_redactor().redact_value({"q": CANARY}) == {"q": ph("canary")}
    monkeypatch.setenv("LOOPWATCH_REDACTION_CANARIES", str(tmp_path / "missing.txt"))
    assert default_redactor().redact_value({"password": "x"}) == {"password": ph("sensitive_key")}


def test_regex_matcher_finds_overlapping_forms() -> None:
    matcher = RegexCanaryMatcher(["abcdefgh", "defghijk"])
    assert matcher.find_spans("xxabcdefghijk") == [(2, 10), (5, 13)]
    assert RegexCanaryMatcher([]).find_spans("abc") == []


def test_public_names_match_all() -> None:
    public = {name for name in vars(redaction) if not name.startswith("_")} - {"annotations"}
    assert public == set(redaction.__all__)
    assert len(redaction.__all__) == len(set(redaction.__all__))
    # Every public class of the private modules is re-exported (their other public
    # functions are shared between the modules only).
    for module in (_canaries, _command_line, _redactor, _rules):
        classes = {
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and value.__module__ == module.__name__
            and not name.startswith("_")
        }
        assert classes <= set(redaction.__all__), module.__name__
    # The names the rest of loopwatch imports from here.
    imported_elsewhere = {
        *("RULE_CANARY", "Hits", "RedactionRules", "Redactor", "canary_forms"),
        *("canaries_from_env", "load_canaries", "default_redactor", "PLACEHOLDER_PREFIX"),
    }
    assert imported_elsewhere <= set(redaction.__all__)


# Hostile input: no crash, no hang.


@pytest.mark.timeout(60)
def test_hostile_inputs_terminate_quickly() -> None:
    start = time.monotonic()
    cases = [
        "a" * 2_000_000,
        "sk-" * 300_000,
        "eyJ" * 300_000 + ".",
        ("-----BEGIN " + "PRIVATE KEY-----") * 40_000,
        "password=" * 200_000,
        'password="' * 100_000,
        "mysql " * 100_000,
        "mysql-" * 200_000,  # once quadratic: 312 s for 1 MB
        ("docker login mongosh redis-cli mysql 7z zip ssh-keygen ldapsearch openssl " * 5_000),
        "docker login " * 50_000 + "-p x",
        "machine " * 50_000 + "password x",
        "echo " * 100_000 + "| sudo -S",
        "://" * 300_000 + "@",
        "[" * 200_000 + "]" * 200_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        json.dumps([[[[[["x" * 1000]]]]]] * 500),
        "\ud800 lone surrogate " + CANARY,
    ]
    for text in cases:
        out, _ = REDACTOR.redact_text(text)
        assert REDACTOR.redact_text(out)[0] == out
    deep: object = "leaf"
    for _ in range(5_000):
        deep = [deep]
    REDACTOR.redact_value({"deep": deep})
    wide = {f"attr.{i}": f"value {i}" for i in range(100_000)}
    wide["db.password"] = "x"
    assert REDACTOR.redact_value(wide)["db.password"] == ph("sensitive_key")
    assert time.monotonic() - start < 45


# Laws (hypothesis).

SECRETS = [OPENAI, ANTHROPIC, GITHUB_PAT, SLACK_BOT, GOOGLE, STRIPE_LIVE, JWT, AWS_ID, PEM, CANARY]
pieces = st.one_of(
    st.text(max_size=30),
    st.sampled_from(SECRETS),
    st.sampled_from(
        [
            *("password=", "Bearer ", "://u:", "@h", '{"token":', "}", '"', "\\", "[REDACTED:jwt]"),
            *("--db.password ", "PGPASSWORD='", "mysql -p", "docker login -p ", " ", "\n", ";"),
            *("machine h ", "password ", "zip -P ", "| sudo -S", "-passin pass:", "echo "),
        ]
    ),
)
texts = st.lists(pieces, max_size=8).map("".join)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), texts),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.sampled_from(["q", "password", "token_count", "x-api-key", "note"]) | texts,
            children,
            max_size=4,
        ),
    ),
    max_leaves=12,
)
HMAC_REDACTOR = Redactor(canaries=[CANARY, CANARY_ODD], hmac_key=b"h" * 16)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(texts)
def test_law_redacting_twice_equals_once(text: str) -> None:
    for redactor in (REDACTOR, HMAC_REDACTOR):
        once, _ = redactor.redact_text(text)
        assert redactor.redact_text(once) == (once, {})


@settings(derandomize=True, max_examples=200, deadline=None)
@given(json_values)
def test_law_values_twice_equals_once(value: object) -> None:
    once = REDACTOR.redact_value(value)
    twice = REDACTOR.redact_value(once)
    assert twice == once
    assert REDACTOR.redact_value(json.dumps(once)) == REDACTOR.redact_value(json.dumps(twice))


def _fresh_redactor() -> Redactor:
    return Redactor(canaries=[CANARY, CANARY_ODD], hmac_key=b"h" * 16)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=6))
def test_law_warm_caches_change_nothing(values: list[object]) -> None:
    # The clean caches (plain strings, and JSON text by the depth it was walked at) are
    # memoization only: a redactor that has seen every value before, as JSON text at
    # several depths too, answers exactly what a fresh one does, hits included.
    warm = _fresh_redactor()
    inputs = [*values, *(json.dumps(v) for v in values), *([v] for v in values)]
    inputs += [{"n": [json.dumps(v)]} for v in values]
    for value in inputs:
        warm.scrub_value(value, {})
    for value in inputs:
        warm_hits: dict[str, int] = {}
        fresh_hits: dict[str, int] = {}
        assert warm.scrub_value(value, warm_hits) == _fresh_redactor().scrub_value(
            value, fresh_hits
        )
        assert warm_hits == fresh_hits


def test_clean_json_text_is_walked_once_per_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = json.dumps(
        {f"max_{k}": {"source": "default", "value": 4} for k in ("tokens", "turns")}
    )
    limits += " " * 300  # longer than the plain cache admits
    redactor = _fresh_redactor()
    parsed: list[str] = []
    real_parse = _redactor._parse_json
    monkeypatch.setattr(_redactor, "_parse_json", lambda t, d: parsed.append(t) or real_parse(t, d))
    for _ in range(3):
        assert redactor.redact_value({"loopwatch.limits": limits}) == {"loopwatch.limits": limits}
    assert len(parsed) == 1
    # Another depth is walked again, and at the depth limit the text is not parsed.
    assert redactor.redact_value([[limits]]) == [[limits]]
    assert len(parsed) == 2
    deep: object = limits
    for _ in range(redactor.rules.max_json_depth):
        deep = [deep]
    assert redactor.redact_value(deep) == _fresh_redactor().redact_value(deep)
    # A secret is never remembered as clean.
    leaky = json.dumps({"max_tokens": 4, "note": f"key {OPENAI}"})
    for _ in range(2):
        assert OPENAI not in redactor.redact_value({"a": leaky})["a"]


# An alphabet that cannot spell any trigger, JSON, URL or assignment: no letter a, e,
# i, k, o, no uppercase, no ':', '=', '/', '{', '['.
SAFE = "bcdfghjlmnpqrstuvwxyz0123456789 .,;!?()-_'\"\téßøλж漢"


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.text(alphabet=SAFE, max_size=200))
def test_law_non_secret_text_is_left_intact(text: str) -> None:
    assert REDACTOR.redact_text(text) == (text, {})
    assert REDACTOR.redact_value({"note": text, "n": [text]}) == {"note": text, "n": [text]}


encodings = st.sampled_from(["raw", "json", "quote", "quote_plus", "b64", "b64url", "b64nopad"])


def _encode(canary: str, how: str, prefix: bytes) -> str:
    if how == "raw":
        return canary
    if how == "json":
        return json.dumps(canary)[1:-1]
    if how == "quote":
        return urllib.parse.quote(canary, safe="")
    if how == "quote_plus":
        return urllib.parse.quote_plus(canary)
    data = prefix + canary.encode() + prefix[::-1]
    if how == "b64":
        return base64.b64encode(data).decode()
    if how == "b64url":
        return base64.urlsafe_b64encode(data).decode()
    return base64.b64encode(data).decode().rstrip("=")


@settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    st.text(max_size=40),
    st.text(max_size=40),
    st.sampled_from([CANARY, CANARY_ODD]),
    encodings,
    st.binary(max_size=5),
)
def test_law_no_canary_survives_in_text(
    before: str, after: str, canary: str, how: str, prefix: bytes
) -> None:
    encoded = _encode(canary, how, prefix)
    out, hits = REDACTOR.redact_text(before + encoded + after)
    assert hits.get("canary", 0) >= 1
    assert encoded not in out
    assert canary not in out


def test_public_entry_points_fail_closed_when_the_stack_runs_out() -> None:
    redactor = Redactor(RedactionRules(max_json_depth=256))
    nested: object = "token=x"
    for _ in range(250):
        nested = [nested]
    text = json.dumps(nested)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 150)
    try:
        value_result = redactor.redact_value(nested)
        text_result = redactor.redact_text(text)
    finally:
        sys.setrecursionlimit(limit)
    assert value_result == ph("depth")
    assert "token=x" not in text_result[0], "parse fails, raw-text rules still apply"
    with pytest.raises(RecursionError):
        sys.setrecursionlimit(len(inspect.stack(0)) + 150)
        try:
            redactor.scrub_value(nested, {})
        finally:
            sys.setrecursionlimit(limit)


# Inputs that got a secret or canary past an earlier version of the rules.


def _escape_letters(text: str) -> str:
    """``text`` with every ASCII letter written as a JSON ``\\u`` escape (valid JSON)."""
    return "".join(f"\\u{ord(c):04x}" if c.isalpha() and c.isascii() else c for c in text)


@pytest.mark.parametrize(
    "template",
    [
        '{"a":"%s","a":"ok"}',
        '[1,{"b":{"a":"%s","a":"ok"}}]',
        '{"a":"%s","a":"ok","a":"ok2"}',
    ],
)
@pytest.mark.parametrize("secret", ["canary", "canary_escaped", "openai", "password"])
def test_json_with_duplicate_keys_hides_no_dropped_value(template: str, secret: str) -> None:
    # json.loads keeps the last of duplicate keys, so the walk never saw the first value;
    # with nothing else to change, the original text (first value included) was kept.
    value = {
        "canary": CANARY,
        "canary_escaped": _escape_letters(CANARY),
        "openai": OPENAI,
        "password": "token=hunter2-xyz",
    }[secret]
    text = template % value
    redactor = Redactor(canaries=[CANARY])
    out, hits = redactor.redact_text(text)
    assert value not in out and "hunter2" not in out
    assert "7f3a9c21" not in out and "a1B2c3D4" not in out
    assert json.loads(out) == json.loads(text), "what last-wins parsers read is kept"
    if secret.startswith("canary"):
        assert hits.get("canary") == 1, "the dropped canary still raises the signal"
    assert redactor.redact_text(out) == (out, {})


def test_json_with_duplicate_keys_under_a_sensitive_key_keeps_no_secret() -> None:
    text = '{"password":"hunter2-xyz","password":"[REDACTED:sensitive_key]"}'
    out, _ = Redactor().redact_text(text)
    assert "hunter2" not in out


@pytest.mark.parametrize("canaries", [(), (CANARY,)])
def test_json_with_duplicate_keys_at_the_depth_bound_does_not_raise(
    canaries: tuple[str, ...],
) -> None:
    # The shadowed value {"password": 1} sits past the bound: it is counted for canaries
    # without a walk, and with no canary registered there is nothing to count.
    redactor = Redactor(RedactionRules(max_json_depth=2), canaries=canaries)
    hits: dict[str, int] = {}
    out = redactor.scrub_value(['{"a":{"password":1},"a":2}'], hits)
    assert out == ['"[REDACTED:depth]"'] and hits == {"depth": 1}


def test_json_text_too_deep_to_walk_with_escapes_fails_closed() -> None:
    # Past the depth bound (or past what json.loads can nest), JSON text is scanned as
    # text, where \\u escapes of ordinary letters hide a canary that any JSON reader sees.
    escaped = _escape_letters(CANARY)
    redactor = Redactor(canaries=[CANARY])
    at_bound = "[" * 62 + json.dumps(f'{{"a":"{escaped}"}}') + "]" * 62
    out = redactor.redact_value({"x": at_bound})
    assert escaped not in json.dumps(out) and "\\\\u" not in out["x"]
    for depth in (2000, 200_000):
        text = "[" * depth + f'"{escaped}"' + "]" * depth
        out, hits = redactor.redact_text(text)
        assert escaped not in out and hits == {"canary": 1, "depth": 1}
    # Without an escape the text is still scanned as text, as before (no false alarms).
    plain = "[" * 2000 + f'"{CANARY}", "ok"' + "]" * 2000
    out, hits = redactor.redact_text(plain)
    assert CANARY not in out and hits == {"canary": 1} and out.startswith("[[[")


@pytest.mark.parametrize(
    "encode",
    [
        # JavaScript encodeURIComponent / encodeURI (ECMA-262 19.2.6): "!'()*" stay raw.
        lambda s: urllib.parse.quote(s, safe="-_.!~*'()"),
        lambda s: urllib.parse.quote(s, safe=";,/?:@&=+$#-_.!~*'()"),
        # WHATWG application/x-www-form-urlencoded (URLSearchParams): "*" raw, "~" encoded.
        lambda s: urllib.parse.quote_plus(s, safe="*").replace("~", "%7E"),
    ],
)
def test_canary_url_encoded_by_javascript_is_redacted(encode: object) -> None:
    canary = "lw canary!(x)*'~7"
    encoded = encode(canary)  # type: ignore[operator]
    assert encoded != urllib.parse.quote(canary, safe="")
    out, hits = Redactor(canaries=[canary]).redact_text(f"https://h/p?q={encoded}&x=1")
    assert encoded not in out and hits == {"canary": 1}


@pytest.mark.parametrize(
    "escape",
    [
        # Go's encoding/json (HTML-safe by default) and .NET's System.Text.Json escape
        # < > & ' + " as \u00XX; Java and .NET write uppercase hex; any letter may be
        # escaped. A fragment of such JSON inside plain text is not parsed as JSON.
        lambda s: s.replace("<", "\\u003c").replace("&", "\\u0026"),
        lambda s: s.replace('"', "\\u0022").replace("é", "\\u00E9"),
        _escape_letters,
    ],
)
def test_canary_in_any_json_unicode_escape_inside_text_is_redacted(escape: object) -> None:
    canary = 'lw<canary&"é-7f3a'
    escaped = escape(canary)  # type: ignore[operator]
    assert escaped not in canary_forms(canary)
    text = f'request failed: body={{"q":"{escaped}"}} (retrying)'
    out, hits = Redactor(canaries=[canary]).redact_text(text)
    assert escaped not in out and hits == {"canary": 1}
    assert out.startswith("request failed: body=") and out.endswith('"} (retrying)')


def test_canary_escaped_in_json_that_does_not_parse_is_redacted() -> None:
    canary = 'lw<canary&"é-7f3a'
    escaped = _escape_letters(canary)
    redactor = Redactor(canaries=[canary])
    for text in (f'{{"q":"{escaped}",}}', f'["{escaped}"'):
        out, hits = redactor.redact_text(text + "]" if text.startswith("[") else text)
        assert escaped not in out and hits == {"canary": 1}


@pytest.mark.parametrize(
    "text",
    [
        "[" * 70 + json.dumps(CANARY) + "]" * 70,  # past max_json_depth: walked, cut
        '{"a":' * 70 + json.dumps({CANARY: 1}) + "}" * 70,  # in a key
        "[" * 2000 + json.dumps(CANARY) + ',"\\n"' + "]" * 2000,  # past json.loads
        "[" * 62 + json.dumps(json.dumps([CANARY, "\\n"])) + "]" * 62,  # at the bound
    ],
)
def test_a_canary_replaced_with_a_depth_placeholder_is_still_counted(text: str) -> None:
    out, hits = Redactor(canaries=[CANARY]).redact_text(text)
    assert CANARY not in out and "depth" in out
    assert hits.get("canary") == 1, "the canary signal is raised once"


def test_a_canary_deep_under_a_sensitive_key_is_counted() -> None:
    value: object = [CANARY]
    for _ in range(70):
        value = [value]
    out = Redactor(canaries=[CANARY]).scrub_value({"password": value}, hits := {})
    assert out == {"password": ph("canary")} and hits == {"canary": 1}


@pytest.mark.parametrize("ensure_ascii", [True, False])
@pytest.mark.parametrize("prefix", [b"", b"{", b'{"k":'])
def test_canary_in_base64_encoded_json_is_redacted(ensure_ascii: bool, prefix: bytes) -> None:
    # A JSON document that is then base64-encoded (a Kubernetes secret, a JWT claim set,
    # a data: URL) holds the canary JSON-escaped: " and non-ASCII become \" and \u00e9.
    document = prefix + json.dumps({"q": CANARY_ODD}, ensure_ascii=ensure_ascii).encode()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode(document).decode()
        out, hits = Redactor(canaries=[CANARY_ODD]).redact_text(f"blob {encoded} end")
        assert hits == {"canary": 1} and encoded not in out


@pytest.mark.parametrize("invisible", ["\u2060", "\u200b", "\u200d", "\ufeff", "\u00ad"])
def test_canary_with_invisible_characters_inside_is_redacted(invisible: str) -> None:
    # Displays do not show these, and the dashboard removes U+2060 from client text (it
    # places its own), so it showed the exact canary stored with one inside.
    hidden = CANARY[:5] + invisible + CANARY[5:12] + invisible * 2 + CANARY[12:]
    out, hits = Redactor(canaries=[CANARY]).redact_text(f"tool {hidden} done")
    assert out == f"tool {ph('canary')} done" and hits == {"canary": 1}
    wrapped = "x\n" + hidden[:9] + "\n  " + hidden[9:]
    out, hits = Redactor(canaries=[CANARY]).redact_text(wrapped)
    assert out == "x\n" + ph("canary") and hits == {"canary": 1}


@pytest.mark.parametrize(
    "template",
    ["[REDACTED:{}]", "x [REDACTED:a{}] y", "[REDACTED:{}:0123abcd]", "[REDACTED:{}_x]"],
)
def test_a_canary_inside_a_fake_placeholder_is_redacted(template: str) -> None:
    # Placeholders are atomic, but only those of a rule this redactor has: a canary of
    # lowercase letters, digits and "_" fits the placeholder syntax as a rule name.
    canary = "lwcanary_7f3a9c21"
    redactor = Redactor(canaries=[canary], hmac_key=b"k" * 16)
    text = template.format(canary)
    out, hits = redactor.redact_text(text)
    assert canary not in out and hits == {"canary": 1}
    assert canary not in json.dumps(redactor.redact_value({"password": text}))
    assert redactor.redact_text(out) == (out, {})


# Each row failed on an earlier version of the rules (leaks, or text destroyed around a
# closing quote or a container name); docs/reliability.md tells how each was found.
REVIEW_CASES: list[tuple[str, str, str, dict[str, int]]] = [
    (
        "cli password flag quoted",
        'docker login -u me -p "hunter 2 x" r\nsshpass -p \'a b\' ssh h\nredis-cli -a \'a b\' ping\nmysql -p"hunter 2"\n7za x a.7z -p"hunter 2"\nssh-keygen -N "correct horse battery"\nldapsearch -w "hunter 2"\nopenssl pkcs12 -passout \'pass:hunter 2\'\nkeytool -storepass "hunter 2"\nsmbclient -U "DOMAIN\\\\alice%hunter 2"\necho \'hunter 2\' | sudo -S ls',
        'docker login -u me -p "[REDACTED:cli_password_flag]" r\nsshpass -p \'[REDACTED:cli_password_flag]\' ssh h\nredis-cli -a \'[REDACTED:cli_password_flag]\' ping\nmysql -p"[REDACTED:cli_password_flag]"\n7za x a.7z -p"[REDACTED:cli_password_flag]"\nssh-keygen -N "[REDACTED:cli_password_flag]"\nldapsearch -w "[REDACTED:cli_password_flag]"\nopenssl pkcs12 -passout \'pass:[REDACTED:cli_password_flag]\'\nkeytool -storepass "[REDACTED:cli_password_flag]"\nsmbclient -U "DOMAIN\\\\alice%[REDACTED:cli_password_flag]"\necho \'[REDACTED:cli_password_flag]\' | sudo -S ls',
        {"cli_password_flag": 11},
    ),
    (
        "cli password flag json-escaped",
        '{"cmd":"docker login -u me -p \\"hunter2\\" r"\n{"cmd":"echo \\"hunter2\\" | sudo -S ls"',
        '{"cmd":"docker login -u me -p \\"[REDACTED:cli_password_flag]\\" r"\n{"cmd":"echo \\"[REDACTED:cli_password_flag]\\" | sudo -S ls"',
        {"cli_password_flag": 2},
    ),
    (
        "cli password flag, every option of a command",
        "keytool -importkeystore -srckeystore a -srcstorepass s1 -deststorepass s2 -destkeypass s3\nopenssl pkcs12 -in a.p12 -passin pass:aaa -passout pass:bbb\nssh-keygen -p -P old -N new -f key",
        "keytool -importkeystore -srckeystore a -srcstorepass [REDACTED:cli_password_flag] -deststorepass [REDACTED:cli_password_flag] -destkeypass [REDACTED:cli_password_flag]\nopenssl pkcs12 -in a.p12 -passin pass:[REDACTED:cli_password_flag] -passout pass:[REDACTED:cli_password_flag]\nssh-keygen -p -P [REDACTED:cli_password_flag] -N [REDACTED:cli_password_flag] -f key",
        {"cli_password_flag": 7},
    ),
    (
        "cli password flag, more forms",
        "docker login -u me \\\n  -p hunter2 r\ndocker --config /x login -u me -p hunter2\naz acr login -n reg -p hunter2\nredis-cli --pass hunter2 ping\nopenssl pkcs12 -in a.p12 -password pass:hunter2\nssh-keygen -Nhunter2 -f k\nldapsearch -D cn=a -whunter2\nunzip -Phunter2 a.zip\nsmbclient //s/x -Ualice%hunter2\n7zz x -phunter2 a.7z\ndocker exec -it db mysql -uroot -phunter2\nkubectl exec db -- mysql -uroot -phunter2\nsudo -E docker login -u a -p hunter2",
        "docker login -u me \\\n  -p [REDACTED:cli_password_flag] r\ndocker --config /x login -u me -p [REDACTED:cli_password_flag]\naz acr login -n reg -p [REDACTED:cli_password_flag]\nredis-cli --pass [REDACTED:cli_password_flag] ping\nopenssl pkcs12 -in a.p12 -password pass:[REDACTED:cli_password_flag]\nssh-keygen -N[REDACTED:cli_password_flag] -f k\nldapsearch -D cn=a -w[REDACTED:cli_password_flag]\nunzip -P[REDACTED:cli_password_flag] a.zip\nsmbclient //s/x -Ualice%[REDACTED:cli_password_flag]\n7zz x -p[REDACTED:cli_password_flag] a.7z\ndocker exec -it db mysql -uroot -p[REDACTED:cli_password_flag]\nkubectl exec db -- mysql -uroot -p[REDACTED:cli_password_flag]\nsudo -E docker login -u a -p [REDACTED:cli_password_flag]",
        {"cli_password_flag": 13},
    ),
    (
        "sudo -S forms",
        "echo hunter2|sudo -S ls\necho -n hunter2 | sudo -S ls\necho hunter2 | sudo -u root -S ls\necho hunter2 | sudo --stdin ls\nprintf %s hunter2 | sudo -S ls",
        "echo [REDACTED:cli_password_flag]|sudo -S ls\necho -n [REDACTED:cli_password_flag] | sudo -S ls\necho [REDACTED:cli_password_flag] | sudo -u root -S ls\necho [REDACTED:cli_password_flag] | sudo --stdin ls\nprintf %s [REDACTED:cli_password_flag] | sudo -S ls",
        {"cli_password_flag": 5},
    ),
    (
        "cli password flag in argument lists",
        "      test: [\"CMD\", \"redis-cli\", \"-a\", \"hunter2\", \"ping\"]\nsubprocess.run(['sshpass', '-p', 'hunter2', 'ssh', 'h'])",
        "      test: [\"CMD\", \"redis-cli\", \"-a\", \"[REDACTED:cli_password_flag]\", \"ping\"]\nsubprocess.run(['sshpass', '-p', '[REDACTED:cli_password_flag]', 'ssh', 'h'])",
        {"cli_password_flag": 2},
    ),
    (
        "netrc quoted and printf",
        "machine h password \"hunter 2\"\nprintf 'machine h\\nlogin me\\npassword hunter2\\n' >> ~/.netrc",
        "machine h password [REDACTED:netrc_password]\nprintf 'machine h\\nlogin me\\npassword [REDACTED:netrc_password]\\n' >> ~/.netrc",
        {"netrc_password": 2},
    ),
    (
        "a long quoted value",
        'x = 1\nheaders = {"Cookie": "sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; sid=abc; "}\ny = 2',
        'x = 1\nheaders = {"Cookie": "[REDACTED:assignment]"}\ny = 2',
        {"assignment": 1},
    ),
    (
        "cli password flag: a command word that is not the command",
        "docker run -d --name mongo -p 27017:27017 mongo:7\nssh mongo -p 2222\nsshpass -e ssh -p 2222 user@host\nsshpass -f ~/.pw ssh -o StrictHostKeyChecking=no -p 22 user@host\nfind / -type d -name mysql -prune\ndocker run --name mysql -p3306:3306 -d mysql:8\nnc -z ldap 389 -w 2",
        "docker run -d --name mongo -p 27017:27017 mongo:7\nssh mongo -p 2222\nsshpass -e ssh -p 2222 user@host\nsshpass -f ~/.pw ssh -o StrictHostKeyChecking=no -p 22 user@host\nfind / -type d -name mysql -prune\ndocker run --name mysql -p3306:3306 -d mysql:8\nnc -z ldap 389 -w 2",
        {},
    ),
    (
        "a closing quote is not an opening one",
        'print("password:", password)\nread -s -p "Password: " PW; echo "$PW" | docker login -u me --password-stdin\nmsg = "Invalid password: " + user.name + " at " + host',
        'print("password:", password)\nread -s -p "Password: " PW; echo "$PW" | docker login -u me --password-stdin\nmsg = "Invalid password: " + user.name + " at " + host',
        {},
    ),
    (
        "netrc words in prose",
        "Change the default password immediately after install.\nBy default password authentication is disabled in sshd_config",
        "Change the default password immediately after install.\nBy default password authentication is disabled in sshd_config",
        {},
    ),
    (
        "quoted values starting with punctuation",
        "DB_PASSWORD=\"+aB3$xY9\"\npassword: ';bZUAV>/~b1I'\n--password ']L^-rN^bLi'",
        "DB_PASSWORD=\"[REDACTED:assignment]\"\npassword: '[REDACTED:assignment]'\n--password '[REDACTED:assignment]'",
        {"assignment": 3},
    ),
    (
        "; & | inside quotes",
        'mongosh "mongodb://db:27017/app?authSource=admin&tls=true" -u root -p S3cretPw\nmysql -h db -e "DROP DATABASE x; CREATE DATABASE x" -uroot -pS3cretPw',
        'mongosh "mongodb://db:27017/app?authSource=admin&tls=true" -u root -p [REDACTED:cli_password_flag]\nmysql -h db -e "DROP DATABASE x; CREATE DATABASE x" -uroot -p[REDACTED:cli_password_flag]',
        {"cli_password_flag": 2},
    ),
    (
        "written \\n escapes",
        "{'command': 'cd /app\\nmysql -uroot -phunter2 db'}\ncmd: \"cd /app\\nredis-cli -a hunter2 ping\"\ntool args: {\"cmd\":\"set -e\\necho hunter2 | sudo -S ls\"} done\n{'env': 'DEBUG=1\\npassword=hunter2\\nport=5432'}",
        "{'command': 'cd /app\\nmysql -uroot -p[REDACTED:cli_password_flag] db'}\ncmd: \"cd /app\\nredis-cli -a [REDACTED:cli_password_flag] ping\"\ntool args: {\"cmd\":\"set -e\\necho [REDACTED:cli_password_flag] | sudo -S ls\"} done\n{'env': 'DEBUG=1\\npassword=[REDACTED:assignment]\\nport=5432'}",
        {"cli_password_flag": 3, "assignment": 1},
    ),
    (
        "backslashes, Makefile recipes, lists",
        'docker login -u me -p Pa\\$\\$w0rd reg\ndocker login -u me -p \\!Passw0rd ghcr.io\nPASSWORD="abc\\def ghi"\n\t@mysql -uroot -phunter2 -e "CREATE DATABASE app"\n\t@docker login -u me -p hunter2 ghcr.io\nsubprocess.run(["docker", "login", "-u", "me", "-p", "hunter2", "ghcr.io"])\nx = [ "redis-cli" , "-a" , "hunter2" ]',
        'docker login -u me -p [REDACTED:cli_password_flag] reg\ndocker login -u me -p [REDACTED:cli_password_flag] ghcr.io\nPASSWORD="[REDACTED:assignment]"\n\t@mysql -uroot -p[REDACTED:cli_password_flag] -e "CREATE DATABASE app"\n\t@docker login -u me -p [REDACTED:cli_password_flag] ghcr.io\nsubprocess.run(["docker", "login", "-u", "me", "-p", "[REDACTED:cli_password_flag]", "ghcr.io"])\nx = [ "redis-cli" , "-a" , "[REDACTED:cli_password_flag]" ]',
        {"cli_password_flag": 6, "assignment": 1},
    ),
    (
        "more options",
        "docker -H tcp://10.0.0.5:2376 login -u me -p hunter2\ndocker --tlsverify --tlscacert ca.pem --tlscert c.pem --tlskey k.pem login -u me -p hunter2\nkeytool -storepasswd -new NEWSECRET -storepass oldpw -keystore k.jks\nldappasswd -x -D cn=admin,dc=ex,dc=com -w adminpw -s NEWPW uid=bob,dc=ex,dc=com\nprintf 'hunter2\\n' | sudo -S apt update\nskopeo copy --src-creds me:hunter2 docker://a docker://b\nredis-server --requirepass hunter2 --masterauth s2",
        "docker -H tcp://10.0.0.5:2376 login -u me -p [REDACTED:cli_password_flag]\ndocker --tlsverify --tlscacert ca.pem --tlscert c.pem --tlskey k.pem login -u me -p [REDACTED:cli_password_flag]\nkeytool -storepasswd -new [REDACTED:cli_password_flag] -storepass [REDACTED:cli_password_flag] -keystore k.jks\nldappasswd -x -D cn=admin,dc=ex,dc=com -w [REDACTED:cli_password_flag] -s [REDACTED:cli_password_flag] uid=bob,dc=ex,dc=com\nprintf '[REDACTED:cli_password_flag]' | sudo -S apt update\nskopeo copy --src-creds me:[REDACTED:cli_password_flag] docker://a docker://b\nredis-server --requirepass [REDACTED:cli_password_flag] --masterauth [REDACTED:cli_password_flag]",
        {"cli_password_flag": 10},
    ),
    (
        "past a mention's 4,096 characters",
        "INFO checking mysql connectivity " + "x" * 4073 + " mysql -uroot -pS3cretPw db",
        "INFO checking mysql connectivity "
        + "x" * 4073
        + " mysql -uroot -p[REDACTED:cli_password_flag] db",
        {"cli_password_flag": 1},
    ),
    (
        "a command word inside a name or path",
        'docker run -d --name mongodb -v mongo-data:/data/db -p 27017:27017 mongo:7\nkubectl exec -it mongo-0 -- mkdir -p /backup\ndocker compose -f mongo/docker-compose.yml -p stack up -d\ndocker compose -f mongo.yml -p stack up -d\ndocker run -d --name mongo-express --net mongo-net -p 8081:8081 mongo-express\ndocker run -v mysql-data:/var/lib/mysql -p3306:3306 mysql:8\nkubectl patch sts mongo -p \'{"spec":{"replicas":3}}\'\ndocker exec mongo mkdir -p /data/backup\nldapsearch -x -s sub -b dc=x',
        'docker run -d --name mongodb -v mongo-data:/data/db -p 27017:27017 mongo:7\nkubectl exec -it mongo-0 -- mkdir -p /backup\ndocker compose -f mongo/docker-compose.yml -p stack up -d\ndocker compose -f mongo.yml -p stack up -d\ndocker run -d --name mongo-express --net mongo-net -p 8081:8081 mongo-express\ndocker run -v mysql-data:/var/lib/mysql -p3306:3306 mysql:8\nkubectl patch sts mongo -p \'{"spec":{"replicas":3}}\'\ndocker exec mongo mkdir -p /data/backup\nldapsearch -x -s sub -b dc=x',
        {},
    ),
    (
        "quoted values starting with a space or a bracket",
        'SSHPASS=" Jhq`Pk" sshpass -e ssh h\nDB_PASSWORD=" lead space"\n"password": " x y"\nx = {"token": ")abc"}',
        'SSHPASS="[REDACTED:assignment]" sshpass -e ssh h\nDB_PASSWORD="[REDACTED:assignment]"\n"password": "[REDACTED:assignment]"\nx = {"token": "[REDACTED:assignment]"}',
        {"assignment": 4},
    ),
    (
        "podman and buildah login --creds, comments, backticks",
        "podman login --creds u:s3cr3t\npodman login --creds=u:s3cr3t quay.io\nbuildah login --creds u:s3cr3t\ndocker login -u me -p s3cr3t reg # then ssh -p 22\nredis-cli -a s3cr3t`\nx=$(redis-cli -a s3cr3t)",
        "podman login --creds u:[REDACTED:cli_password_flag]\npodman login --creds=u:[REDACTED:cli_password_flag] quay.io\nbuildah login --creds u:[REDACTED:cli_password_flag]\ndocker login -u me -p [REDACTED:cli_password_flag] reg # then ssh -p 22\nredis-cli -a [REDACTED:cli_password_flag]`\nx=$(redis-cli -a [REDACTED:cli_password_flag])",
        {"cli_password_flag": 6},
    ),
    (
        "code building a command or a message",
        'print("password:",pw)\nprint(\'password:\',pw)\nlog("password:",pw, "x")\nos.system("mysql -uroot -p" + pw)',
        'print("password:",pw)\nprint(\'password:\',pw)\nlog("password:",pw, "x")\nos.system("mysql -uroot -p" + pw)',
        {},
    ),
]


@pytest.mark.parametrize(
    ("text", "expected", "hits"), [c[1:] for c in REVIEW_CASES], ids=[c[0] for c in REVIEW_CASES]
)
def test_review_cases(text: str, expected: str, hits: dict[str, int]) -> None:
    for redactor in (REDACTOR, HMAC_REDACTOR):
        out, got = redactor.redact_text(text)
        if redactor is REDACTOR:
            assert (out, got) == (expected, hits)
        assert redactor.redact_text(out) == (out, {})


@pytest.mark.parametrize(
    ("value", "expected", "hits"),
    [
        (
            {"argv": ["redis-cli", "-a", "hunter2", "ping"]},
            {"argv": ["redis-cli", "-a", ph("cli_password_flag"), "ping"]},
            1,
        ),
        (["mysql", "-uroot", "-phunter2"], ["mysql", "-uroot", f"-p{ph('cli_password_flag')}"], 1),
        (
            ("sshpass", "-p", "pw", "ssh", "-p", "22", "h"),
            ("sshpass", "-p", ph("cli_password_flag"), "ssh", "-p", "22", "h"),
            1,
        ),
        (["ls", "-p", "x"], ["ls", "-p", "x"], 0),
        (["docker", "run", "-p", "80:80", "nginx"], ["docker", "run", "-p", "80:80", "nginx"], 0),
        # Linear in the list's length: each span finds its element by bisection.
        (
            ["redis-cli", "-a", "pw"] * 20_000,
            ["redis-cli", "-a", "[REDACTED:cli_password_flag]"] * 20_000,
            20_000,
        ),
    ],
)
def test_argument_vectors_are_read_as_one_command_line(
    value: object, expected: object, hits: int
) -> None:
    """An argv (OTel's process.command_args, a tool's JSON command list) is walked element
    by element; its password options are found across elements."""
    out = REDACTOR.redact_value(value)
    assert out == expected
    _, got = REDACTOR.redact_text(json.dumps(value))
    assert got.get("cli_password_flag", 0) == hits
    assert REDACTOR.redact_value(out) == out
