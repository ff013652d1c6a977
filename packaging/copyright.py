"""Write debian/copyright (DEP-5) for vllmwatch and the packages bundled in its virtualenv.

    python3 packaging/copyright.py VENV > .../usr/share/doc/vllmwatch/copyright

The license of each bundled distribution is read from its own metadata (License-Expression,
License, or the classifiers), so the file stays true when the dependencies change.
"""

from __future__ import annotations

import os
import sys
import time
from email.parser import HeaderParser
from pathlib import Path

HEADER = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: vllmwatch
Comment: vllmwatch ships in its own virtualenv under /opt/vllmwatch/venv together with the
 Python distributions it depends on. Their licenses, as each declares in its metadata, are
 listed below; the full texts are in the .dist-info folders of the virtualenv.

Files: *
Copyright: {year} the vllmwatch authors
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
"""


def _license(meta: dict[str, str], classifiers: list[str]) -> str:
    expr = meta.get("License-Expression", "").strip()
    if expr:
        return expr
    text = meta.get("License", "").strip()
    if text and "\n" not in text and len(text) < 60:
        return text
    names = [c.split("::")[-1].strip() for c in classifiers if c.startswith("License ::")]
    return " or ".join(names) or "see the distribution's license file"


def main(venv: str) -> int:
    year = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))).tm_year
    out = [HEADER.format(year=year)]
    for meta_path in sorted(Path(venv).glob("lib/python*/site-packages/*.dist-info/METADATA")):
        msg = HeaderParser().parsestr(meta_path.read_text(errors="replace"))
        name, version = msg.get("Name", "?"), msg.get("Version", "?")
        if name.lower() == "vllmwatch":
            continue
        lic = _license(dict(msg.items()), msg.get_all("Classifier") or [])
        site = meta_path.parent.parent.relative_to(venv)
        out.append(f"Files: opt/vllmwatch/venv/{site}/{meta_path.parent.name.split('-')[0]}*\n"
                   f"Copyright: the {name} authors\n"
                   f"License: {lic}\n"
                   f" {name} {version}, bundled; the full license text is in\n"
                   f" /opt/vllmwatch/venv/{site}/{meta_path.parent.name}/.\n")
    print("\n".join(out), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
