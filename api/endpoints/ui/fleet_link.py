"""Ours in llama.cpp's web UI: a small "Fleet" link to the fleet page (`GET /fleet` from a
browser), added to the page as it is served. Nothing of the UI's own code is touched: the link
is one fixed-position element before `</body>` (top right, under the UI's dialogs), so an
upgrade of the UI keeps it."""

from __future__ import annotations

LINK = (b'<a id="llamaq-fleet-link" href="./fleet" title="The llamaq fleet: workers, queues, '
        b'batches, tenants" style="position:fixed;top:10px;right:14px;z-index:30;'
        b'font:12px/1.6 system-ui,sans-serif;padding:2px 10px;border-radius:999px;'
        b'border:1px solid rgba(127,127,127,.4);color:inherit;text-decoration:none;'
        b'opacity:.75">Fleet</a>\n')


def with_fleet_link(page: bytes) -> bytes:
    """The UI's index.html with the link before its last `</body>` (at the end without one)."""
    end = page.rfind(b"</body>")
    if end < 0:
        return page + LINK
    return page[:end] + LINK + page[end:]
