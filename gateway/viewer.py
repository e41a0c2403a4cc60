"""The trace viewer page (``GET /viewer``): static code that holds no data, the one route served
without a key. Every request it makes carries the key typed into it, so it shows what that key
may see.

Its Content-Security-Policy allows exactly the page's own inline script and style (by their
SHA-256), requests to this origin and nothing else: no other script, no frames, no forms, no
plug-ins. Model output is inserted as text, never HTML, so even a successful injection into the
data has nothing to run.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

VIEWER_HTML = resources.files(__package__).joinpath("viewer.html").read_text(encoding="utf-8")


def _sources(tag: str) -> str:
    """The CSP hash sources of every inline ``<tag>`` block of the page."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", VIEWER_HTML, re.DOTALL)
    digests = (base64.b64encode(hashlib.sha256(block.encode()).digest()).decode() for block in blocks)
    return " ".join(f"'sha256-{d}'" for d in digests)


CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        f"script-src {_sources('script')}",
        f"style-src {_sources('style')}",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)


async def viewer_page(request: Request) -> Response:
    return HTMLResponse(
        VIEWER_HTML,
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
        },
    )
