"""Helpers of the HTTP endpoint's tests (test_http*.py): an in-process app over a real
router, a real uvicorn server (the clock tests move is `support.Clock`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
from support import Clock

from aa.http_api import HttpEndpoint, create_app
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig

PEER = ("127.0.0.1", 40000)


@asynccontextmanager
async def open_api(
    *,
    allow: tuple[str, ...] = ("127.0.0.0/8",),
    max_body: int | None = None,
    peer: tuple[str, int] = PEER,
    clock: Clock | None = None,
    names: tuple[str, ...] | None = ("aa.test",),
    security: SecurityConfig | None = None,
) -> AsyncIterator[tuple[Router, httpx.AsyncClient]]:
    """A started router (with *security*, if given) and an httpx client talking to its app
    in-process, as host ``aa.test``."""
    config = RouterConfig(port=0, name="http-test", **({"security": security} if security else {}))
    async with Router(config) as router:
        clock = clock or Clock()
        kwargs: dict[str, Any] = {
            "allow": allow,
            "clock": clock,
            "wall": clock.wall,
            "names": names,
        }
        if max_body is not None:
            kwargs["max_body"] = max_body
        app = create_app(router, **kwargs)
        transport = httpx.ASGITransport(app=app, client=peer)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://aa.test") as http:
            yield router, http


@asynccontextmanager
async def open_server() -> AsyncIterator[tuple[Router, HttpEndpoint]]:
    """A started router with a real uvicorn endpoint on 127.0.0.1:0."""
    endpoint = HttpEndpoint(host="127.0.0.1", port=0)
    async with Router(RouterConfig(port=0, name="http-real"), endpoints=[endpoint]) as router:
        yield router, endpoint


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def register(http: httpx.AsyncClient, *patterns: str, **body: Any) -> dict[str, Any]:
    """Register an HTTP client with *patterns*; its registration answer (id, token, …)."""
    r = await http.post("/clients", json={"patterns": [{"source": p} for p in patterns], **body})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


@contextmanager
def chromium(*, window: str = "1280,1000") -> Iterator[Any]:
    """A headless Chromium driven through chromedriver (selenium); skips when either is
    missing. No proxy, no background traffic: the browser talks to loopback only."""
    import shutil
    import tempfile

    import pytest

    for program, package in (("chromium", "chromium"), ("chromedriver", "chromium-driver")):
        if shutil.which(program) is None:
            pytest.skip(
                f"{program} is not installed (Debian package {package}; "
                "see tests/setup/system-deps.sh)"
            )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    profile = tempfile.mkdtemp(prefix="aa-chromium-")
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={window}",
        "--proxy-server=direct://",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "chromedriver"), options=options
    )
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


#: Awaits, inside the page, a JavaScript body (``return …``) to be truthy: checked at once,
#: then on every change of the document (a MutationObserver), and every 250 ms for state the
#: document does not show (sessionStorage, a dialog's ``open``). The wait is the page's own:
#: the test awaits one call, which answers as soon as the page changes.
_PAGE_UNTIL = """
const [body, ms, done] = arguments;
const check = new Function(body);
let over = false;
const finish = (answer) => { if (!over) { over = true; observer.disconnect(); done(answer); } };
const test = () => {
  try { const value = check(); if (value) finish({ value }); }
  catch (e) { finish({ error: String(e) }); }
};
const observer = new MutationObserver(test);
const watch = { subtree: true, childList: true, attributes: true, characterData: true };
observer.observe(document, watch);
const tick = setInterval(() => (over ? clearInterval(tick) : test()), 250);
setTimeout(() => finish({ timeout: true }), ms);
test();
"""


def page_until(driver: Any, script: str, timeout: float) -> Any:
    """Blocks until *script* (a function body, ``return …``) is truthy in *driver*'s page;
    its value. Raises TimeoutError after *timeout* seconds, or the page's error."""
    driver.set_script_timeout(timeout + 5)
    answer = driver.execute_async_script(_PAGE_UNTIL, script, int(timeout * 1000))
    if answer.get("timeout"):
        raise TimeoutError(f"not true within {timeout} s: {script}")
    if "error" in answer:
        raise AssertionError(f"{script}: {answer['error']}")
    return answer["value"]
