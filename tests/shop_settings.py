"""The example shop's settings under tests/test_checkout_browser.py: its checkout POSTs held and counted."""

from __future__ import annotations

import importlib

_shop = importlib.import_module("example_project.settings")
globals().update({name: value for name, value in vars(_shop).items() if name.isupper()})
MIDDLEWARE = ["tests.shop_server.HoldFirstCheckout", *_shop.MIDDLEWARE]
