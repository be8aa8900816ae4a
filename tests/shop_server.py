"""The example shop's runserver under test: it counts the checkout POSTs and makes a double click overlap."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse


class HoldFirstCheckout:
    """Writes each checkout POST's key to ``SHOP_POSTS_FILE``; holds the first until the next arrives.

    A slow checkout, as a real payment makes it: the second click of a double click then reaches the
    server while the first is still being answered, and the test reads from the file that it did.
    The first waits at most ``SHOP_HOLD_FIRST_POST`` seconds (0, the default: no hold).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.lock = threading.Lock()
        self.arrived = 0
        self.second = threading.Event()
        self.hold = float(os.environ.get("SHOP_HOLD_FIRST_POST", "0"))

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path == "/":
            with self.lock, open(os.environ["SHOP_POSTS_FILE"], "a") as posts:
                self.arrived += 1
                first = self.arrived == 1
                posts.write(f"{request.POST.get('checkout_key', '')}\n")
            if first and self.hold:
                self.second.wait(self.hold)
            else:
                self.second.set()
        return self.get_response(request)
