"""Screenshot of a report page (headless Chromium), palette-quantised to stay small.

    python benchmarks/report/screenshot.py docs/report/demo/index.html docs/report/demo.png

Needs Debian's ``chromium`` and Pillow (a matplotlib dependency).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from PIL import Image


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("page")
    p.add_argument("output")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1500, help="viewport height (the top of the page)")
    p.add_argument("--scale", type=float, default=0.6, help="resize factor of the PNG")
    p.add_argument("--colors", type=int, default=64)
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "shot.png"
        subprocess.run(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--window-size={args.width},{args.height}",
                f"--screenshot={raw}",
                Path(args.page).resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        img = Image.open(raw).convert("RGB")
        size = (round(img.width * args.scale), round(img.height * args.scale))
        img = img.resize(size, Image.LANCZOS).quantize(colors=args.colors, dither=Image.NONE)
        img.save(args.output, optimize=True)
    print(f"wrote {args.output} ({Path(args.output).stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
