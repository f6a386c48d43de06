"""aa.addins.bundled — the add-ins that come with Aa: simulated publishers for a small office,
driven by `aa.addins.office.OfficeWorld`, and a schema adapter. Host them with
``aa container --bundled`` (or ``aa router --bundled``, as ``make run`` does).

==============  ===============================================================================
add-in          publishes
==============  ===============================================================================
``weather``     ``weather`` events, always (cheap, and what everyone looks at): each city's
                current conditions every ``every`` seconds (2), so a subscriber sees them at once
``quotes``      ``quote`` events {StockSymbol, Price, Currency} — only while some subscription
                in the mesh matches its quench prototype: market data costs money
``ticker``      an adapter: ``quote`` events republished as ``ticker`` events {Symbol, Last,
                Ccy}; it subscribes to quotes only while someone is interested in tickers, so
                a ticker subscriber wakes the adapter, which wakes the quotes publisher
``laptops``     the laptops' ``wifi-scan`` and ``bt-scan`` events
``phones``      the phones' ``position``, ``wifi-scan`` and ``bt-scan`` events
==============  ===============================================================================

Settings (module ``SETTINGS``, overridden by ``NAME.toml`` beside the module): ``seed`` (the
world; keep it the same across add-ins), ``speed`` (world seconds per wall second), ``tick``
(seconds between two publishing rounds; ``every`` for the weather).

This package's modules are loaded by the container from their files; the package itself
exports nothing.
"""

__all__: list[str] = []
