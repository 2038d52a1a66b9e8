"""The docs site (``mkdocs.yml``, ``docs/``): it builds with warnings as errors (broken links
and anchors between pages, docstrings that do not parse), every public name has its
reference entry generated from its docstring, the README's links reach pages that exist,
and the built site opens in headless Chromium, served over HTTP: its title, its navigation,
its search box and a reference page; the search index holds the API's entries. (The pages'
code blocks run in ``test_readme.py``.)"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process.cli_reference import PAGE as CLI_PAGE
from tests.process.cli_reference import page as cli_page
from tests.process.test_observability import chromium, chromium_exe

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=200,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-5000:]
    return out


def _ids(html: Path) -> set[str]:
    return set(re.findall(r'id="([\w.]+)"', html.read_text()))


def test_every_public_name_has_a_reference_entry(site: Path):
    import pccl_aio
    import pccl_aio.blocking
    import pccl_aio.torch

    for module, page in ((pccl_aio, "pccl_aio"), (pccl_aio.torch, "torch"),
                         (pccl_aio.blocking, "blocking")):
        ids = _ids(site / "reference" / page / "index.html")
        names = {f"{module.__name__}.{n}" for n in module.__all__ if n != "__version__"}
        assert names - ids == set(), (page, sorted(names - ids))
    # an entry holds the docstring: the Communicator's first line is on its page
    text = (site / "reference" / "pccl_aio" / "index.html").read_text()
    assert "from_env" in text and "wait_for_peers" in text


def test_the_command_lines_reference_is_current():
    assert CLI_PAGE.read_text() == cli_page(), "run: python -m tests.process.cli_reference"


def test_the_readmes_links_reach_pages_that_exist():
    text = (ROOT / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in t]
    assert len(links) > 20
    assert [t for t in links if not (ROOT / t).exists()] == []
    assert len(text.splitlines()) <= 150


@contextlib.contextmanager
def _served(folder: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined,assignment]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)


async def test_the_built_site_opens_in_a_browser(site: Path, tmp_path: Path):
    chromium_exe()  # skipped (or, under CI=true, failed) if there is none
    with _served(site) as url:
        profile = f"--user-data-dir={tmp_path / 'profile'}"
        home = (await chromium(profile, "--virtual-time-budget=5000", "--dump-dom",
                               f"{url}/")).decode()
        assert re.search(r"<title>\s*pccl_aio\s*</title>", home), home[:500]
        for section in ("Tutorial", "How-to", "Reference", "Explanation"):
            assert f">{section}<" in home or f"> {section} <" in home or section in home
        assert 'class="md-search__input"' in home  # the search box
        page = (await chromium(profile, "--virtual-time-budget=5000", "--dump-dom",
                               f"{url}/reference/pccl_aio/")).decode()
        assert 'id="pccl_aio.Communicator"' in page and "Communicator" in page
    # what the search box searches: every page, the reference's entries among them
    index = json.loads((site / "search" / "search_index.json").read_text())
    titles = {d["location"] for d in index["docs"]}
    assert "reference/pccl_aio/#pccl_aio.Communicator.wait_for_peers" in titles, sorted(
        t for t in titles if "Communicator" in t)[:20]
