"""Which GPUs a CUDA forward-compatibility driver serves: data-center boards only.

The compat driver's note lists the NVML brands it accepts; where the note has no
list, or the GPU's brand is unknown, the consumer boards are refused by brand or
product name (buildmatrix.forward's docstring gives the sources).
"""

from __future__ import annotations

from collections.abc import Sequence

from buildmatrix.binary.compat_note import CompatLibrary

# nvmlBrandType_t values of boards forward compatibility never covers.
CONSUMER_BRANDS = {
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "TITAN",
    15: "GeForce RTX",
    16: "TITAN RTX",
}
_CONSUMER_NAMES = ("geforce", "titan", "nvs ")


def device_refusal(
    library: CompatLibrary, *, products: Sequence[str], brand: int | None = None
) -> str | None:
    """Why the compat driver would refuse these GPUs (None: it accepts them).

    With the GPU's NVML brand, the note's device list decides (buildmatrix.forward's docstring);
    without it, the product names do: GeForce, TITAN and NVS boards are refused.
    """
    if brand is not None:
        if library.devices is not None and brand not in library.devices:
            return f"NVML brand {brand} is not in the library's device list {list(library.devices)}"
        if library.devices is None and brand in CONSUMER_BRANDS:
            return f"a {CONSUMER_BRANDS[brand]} board is not a data-center GPU"
        return None
    consumer = [p for p in products if any(w in p.lower() + " " for w in _CONSUMER_NAMES)]
    if consumer:
        return ", ".join(consumer) + " (not data-center GPUs)"
    return None
