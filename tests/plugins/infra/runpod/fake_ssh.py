"""A stand-in for OpenSSH's ``ssh`` in tests: runs the remote command with bash on this machine.

Installed as ``ssh`` on PATH by the tests. It parses the options olmx passes (``-p``, ``-o``,
``-i``), appends ``{"port", "destination", "options", "command"}`` as one JSON line to
``$FAKE_SSH_LOG``, and runs the command with ``bash -c`` in a fresh, small environment (a real
pod does not see the launching machine's environment): PATH, HOME, LANG, the test's
``OLMX_CACHE_DIR`` and ``OLMX_POD_ENV_FILE`` (what the bootstrap reads instead of
``/proc/1/environ``). A command matching the regex ``$FAKE_SSH_FAIL`` fails the way an
unreachable host does (exit status 255). ``$FAKE_SSH_REFUSE_FIRST=N``: the first N connections
are refused the same way (an sshd still starting); ``$FAKE_SSH_DENY=1``: every connection is
refused the way sshd refuses a key it does not know.
"""

import json
import os
import re
import subprocess
import sys


def main(argv: list[str]) -> int:
    options, port, i = [], None, 0
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if flag in ("-p", "-o", "-i"):
            value = argv[i + 1]
            if flag == "-p":
                port = int(value)
            else:
                options.append(f"{flag} {value}")
            i += 2
        else:
            options.append(flag)
            i += 1
    destination, command = argv[i], " ".join(argv[i + 1 :])
    with open(os.environ["FAKE_SSH_LOG"], "a") as log:
        log.write(json.dumps({"port": port, "destination": destination, "options": options, "command": command}) + "\n")
    refuse = int(os.environ.get("FAKE_SSH_REFUSE_FIRST", "0"))
    if refuse:
        counter = os.environ["FAKE_SSH_LOG"] + ".refused"
        done = len(open(counter).read()) if os.path.exists(counter) else 0
        if done < refuse:
            with open(counter, "a") as f:
                f.write("x")
            print(f"ssh: connect to host {destination.split('@')[-1]} port {port}: Connection refused", file=sys.stderr)
            return 255
    if os.environ.get("FAKE_SSH_DENY") == "1":
        print(f"{destination}: Permission denied (publickey).", file=sys.stderr)
        return 255
    fail = os.environ.get("FAKE_SSH_FAIL")
    if fail and re.search(fail, command):
        print(f"ssh: connect to host {destination.split('@')[-1]} port {port}: Connection refused", file=sys.stderr)
        return 255
    keep = ("PATH", "HOME", "LANG", "OLMX_CACHE_DIR", "OLMX_POD_ENV_FILE", "OLMO_DISABLE_PER_RANK_TRITON_CACHE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return subprocess.run(["bash", "-c", command], env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
