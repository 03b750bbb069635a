"""The browser harness itself: a console error in a page fails the test that opened it."""

from __future__ import annotations

import pytest

from tests.browser import open_page, screenshot

pytestmark = pytest.mark.browser


def test_console_error_fails_the_page_and_screenshots_are_kept():
    with open_page() as page:
        page.set_content("<h1>gradlab</h1>")
        assert page.inner_text("h1") == "gradlab"
        assert screenshot(page, "browser-support").stat().st_size > 0
    with pytest.raises(AssertionError, match="console errors"):
        with open_page() as page:
            page.set_content("<script>console.error('boom')</script>")
            page.wait_for_function("true")
