"""python -m faultrouter taskid --file F --user U --action A [--authorization ID]
python -m faultrouter fingerprints [AVRO_DIR]   (the bundled schemas when AVRO_DIR is left out)"""

from __future__ import annotations

import argparse
import sys

from ._schemas import schema_fingerprints
from .taskid import task_id


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faultrouter")
    sub = p.add_subparsers(dest="verb", required=True)
    t = sub.add_parser("taskid", help="the deterministic task ID of a file's content")
    t.add_argument("--file", required=True, help="the task's input content; - reads stdin")
    t.add_argument("--user", required=True)
    t.add_argument("--action", required=True)
    t.add_argument("--authorization", default="")
    f = sub.add_parser("fingerprints", help="each schema's CRC-64-AVRO fingerprint")
    f.add_argument("avro_dir", nargs="?")
    a = p.parse_args(argv)
    if a.verb == "taskid":
        if a.file == "-":
            print(task_id(sys.stdin.buffer, user=a.user, action=a.action, authorization=a.authorization))
        else:
            with open(a.file, "rb") as fh:
                print(task_id(fh, user=a.user, action=a.action, authorization=a.authorization))
    else:
        for row in schema_fingerprints(a.avro_dir):
            print("\t".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
