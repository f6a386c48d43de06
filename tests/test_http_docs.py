"""The API's documentation as a person sees it: ``/docs`` (Swagger UI) and ``/redoc``
(ReDoc) rendered by headless Chromium from a real server, every file served locally."""

from __future__ import annotations

import asyncio
from typing import Any

from http_helpers import chromium, open_api, open_server

#: Seconds a page may take to fetch the schema and draw it (a loaded 2-core machine).
RENDER_TIMEOUT = 30


def _severe(driver: Any) -> list[dict[str, Any]]:
    """The browser's errors, but for loads our Content-Security-Policy refused: the page
    tried to reach another host and was stopped, as it must be."""
    return [
        e
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "Content Security Policy" not in e["message"]
    ]


def _swagger(url: str) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(url + "docs")
        wait = WebDriverWait(driver, RENDER_TIMEOUT)
        # Swagger UI draws each operation as a block: method and path side by side.
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-get [data-path='/events']"))
        blocks = driver.find_elements(By.CSS_SELECTOR, ".opblock")
        ops = {
            (
                b.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
                b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
            )
            for b in blocks
        }
        # Open POST /events: its request body example is drawn from the schema.
        post = driver.find_element(By.CSS_SELECTOR, ".opblock-post [data-path='/events']")
        post.click()
        wait.until(
            lambda d: d.find_elements(
                By.CSS_SELECTOR,
                ".opblock-post.is-open .body-param__example, .opblock-post.is-open .highlight-code",
            )
        )
        example = driver.find_element(By.CSS_SELECTOR, ".opblock-post.is-open .opblock-body").text
        return {
            "ops": ops,
            "text": driver.find_element(By.TAG_NAME, "body").text,
            "example": example,
            "errors": _severe(driver),
        }


def _redoc(url: str) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(url + "redoc")
        wait = WebDriverWait(driver, RENDER_TIMEOUT)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-section-id^='operation/']"))
        sections = driver.find_elements(By.CSS_SELECTOR, "[data-section-id^='operation/']")
        return {
            "sections": len(sections),
            "text": driver.find_element(By.TAG_NAME, "body").text,
            "errors": _severe(driver),
        }


async def test_swagger_ui_renders_every_operation_in_chromium() -> None:
    async with open_server() as (router, endpoint):
        got = await asyncio.to_thread(_swagger, endpoint.url)
    assert "Unable to render" not in got["text"]
    expected = {
        ("GET", "/events"),
        ("POST", "/events"),
        ("POST", "/clients"),
        ("GET", "/clients/{client_id}/feed"),
        ("POST", "/clients/{client_id}/ack"),
        ("GET", "/mesh"),
        ("GET", "/stream"),
    }
    assert expected <= got["ops"], got["ops"]
    assert "Temperature" in got["example"]  # PublishIn's example, from the schema
    assert got["errors"] == [], got["errors"]


async def test_redoc_renders_the_operations_in_chromium() -> None:
    async with open_server() as (router, endpoint):
        got = await asyncio.to_thread(_redoc, endpoint.url)
    assert got["sections"] >= 10 and "Publish an event" in got["text"], got
    assert got["errors"] == [], got["errors"]


async def test_doc_pages_name_no_outside_host() -> None:
    async with open_api() as (router, http):
        for page, script in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
            r = await http.get(page)
            assert r.status_code == 200 and f"/docs-static/{script}" in r.text
            assert "https://" not in r.text and "http://" not in r.text.replace(
                "http://www.w3.org", ""
            )
            assert r.headers["content-security-policy"].startswith("default-src 'self'")
            js = await http.get(f"/docs-static/{script}")
            assert js.status_code == 200 and len(js.content) > 500_000
        schema = (await http.get("/openapi.json")).json()
        assert schema["openapi"].startswith("3.1")


async def test_docs_are_not_public_beyond_the_allowed_ranges() -> None:
    async with open_api(peer=("10.9.9.9", 1)) as (router, http):
        for path in ("/docs", "/redoc", "/openapi.json", "/docs-static/swagger-ui-bundle.js"):
            assert (await http.get(path)).status_code == 403
