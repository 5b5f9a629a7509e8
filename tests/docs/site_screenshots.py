"""Screenshots of the built docs site in a real headless browser (Debian's `chromium`), to look at.

    python tests/docs/site_screenshots.py [--out DIR] [--site DIR]

builds the site (`mkdocs build --strict`) into a temporary folder, unless `--site` names a built
one, and writes one PNG per view below into `--out` (default: a new temporary folder, so the
screenshots stay out of the repository). Each view is a page with only one section or API object
left visible, the rest of the page's content hidden by a script added to a copy of the page:
the theme, fonts and tables are the site's own. Chromium does not scroll reliably to a fragment
in a headless screenshot, hence the copies. `tests/docs/test_site_html.py::
test_the_pages_render_in_a_headless_browser` (slow) runs it and checks that every PNG shows
something.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: (name, page in the site, id of the heading or API object to show, window height in pixels)
VIEWS = [
    ("quickstart-run-folder", "index.html", "reading-the-output", 1200),
    ("flower-each-round", "flower/index.html", "what-the-wrapper-does-each-round", 2000),
    ("api-registering-a-model", "api/index.html", "registering-a-model", 2400),
    ("cli-commands", "cli/index.html", "commands-errors-resume-and-the-run-folder", 1600),
    ("reference-run", "reference/index.html", "fedsim.api.run", 1500),
    ("reference-runresult", "reference/index.html", "fedsim.api.RunResult", 1300),
    ("reference-modelkind", "reference/index.html", "fedsim.models.ModelKind", 1200),
    ("reference-userleveldp", "reference/index.html", "fedsim.flower.strategy.UserLevelDP", 3000),
    ("threat-model", "threat-model/index.html", "threat-model", 2400),
    ("deploy", "howto/deploy/index.html", "deploy-flowers-deployment-engine-and-docker", 2400),
]

_ISOLATE = """<script>
window.addEventListener('load', () => {
  const el = document.getElementById(%s);
  if (!el) { document.body.innerHTML = '<p>missing id</p>'; return; }
  let n = el.closest('.doc-object');
  if (!n) {  // a Markdown heading: keep it and what follows up to the next heading of its level
    const keep = [el];
    for (let s = el.nextElementSibling; s && s.tagName !== el.tagName; s = s.nextElementSibling) keep.push(s);
    for (const c of [...el.parentElement.children]) if (!keep.includes(c)) c.style.display = 'none';
    n = el.parentElement;
  }
  for (; n && n.tagName !== 'ARTICLE'; n = n.parentElement) {
    const p = n.parentElement;
    if (p) for (const c of p.children) if (c !== n) c.style.display = 'none';
  }
});
</script>"""


def browser() -> str | None:
    """The headless browser's command, or None when none is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    return None


def build_site(into: Path) -> Path:
    """`mkdocs build --strict` into `into`; returns it."""
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(into)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=600)
    return into


def screenshot(site: Path, out: Path, name: str, page: str, ident: str, height: int) -> Path:
    """One view: a copy of `page` that shows only `ident`, as `out/name.png` (1280 pixels wide)."""
    source = site / page
    copy = source.with_name(f"_view_{name}.html")  # beside the page, so its relative links work
    html = source.read_text(encoding="utf-8")
    copy.write_text(html.replace("</body>", _ISOLATE % json.dumps(ident) + "</body>"), encoding="utf-8")
    png = out / f"{name}.png"
    cmd = [browser() or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--virtual-time-budget=3000", f"--window-size=1280,{height}", f"--screenshot={png}", copy.as_uri()]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    copy.unlink()
    return png


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the PNGs (default: a new temporary folder)")
    parser.add_argument("--site", type=Path, help="a built site (default: build one)")
    args = parser.parse_args(argv)
    if browser() is None:
        raise SystemExit("no headless browser: apt-get install chromium")
    out = args.out or Path(tempfile.mkdtemp(prefix="fedsim-site-shots-"))
    out.mkdir(parents=True, exist_ok=True)
    site = args.site or build_site(Path(tempfile.mkdtemp(prefix="fedsim-site-")))
    pngs = [screenshot(site, out, *view) for view in VIEWS]
    for png in pngs:
        print(png)
    return pngs


if __name__ == "__main__":
    main()
