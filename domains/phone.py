"""The customer's phone in tau2-bench's telecom domain: its state, its simulation and its 30 tools.

Telecom is tau2's *dual-control* domain: the agent cannot fix a phone it cannot touch, so it has to talk the
customer through toggling airplane mode, reseating the SIM, resetting the APN settings... The customer acts on
the phone through tools of their own. This file is that phone, re-written from tau2's `TelecomUserDB` and
`TelecomUserTools` (see ../shared/tau2/TELECOM.md, sections 3, 4, 6 and 9; phone_tasks.py has section 7's
functions, which set a task's faults up and check them):

    device        the phone's settings and what it shows (SIM, airplane mode, signal, data, APN, Wi-Fi, VPN, apps)
    surroundings  what the phone cannot change: the user's line number, abroad or not, the signal per technology,
                  and three facts telecom.py's sync copies from the company database (line active, roaming
                  allowed, data usage exceeded) plus a pending payment request
    vpn_default   tau2's one process-wide VPN-details object (quirk below); not part of the user DB's hash

All three are documents of the `phone` collection in the same per-rollout SQLite database as the company's
tables (domains/base.py), so copy-on-write, task initialisation and scoring treat both sides alike. Every value is
stored in tau2's hash form (enums as their value strings, floats as floats), so tau2's
`sha256(json.dumps(model_dump(), sort_keys=True))` of the user DB is one json.dumps away (telecom.user_db_hash).

Why the odd details. tau2 never validates assignments, so a bad argument is stored as given and breaks later calls
with Python's own error text (`set_network_mode_preference(mode=4)` stores 4, searches, then fails on `.value`;
`set_apn_settings("x")` stores the string, and every later network search fails on `.apn_name`). We keep those
values as they are and raise the same AttributeError texts where tau2's attribute access would (`_value`, `_apn`).
A tool that raises after changing the phone keeps the change, as in tau2 (the state is saved in a `finally`).

Quirk kept: the shared VPN details. tau2's `connect_vpn` puts one class-level object on the phone and the
`break_vpn` initialisation degrades that object in place, so every later `connect_vpn` in the process gets a poor
VPN. Here the object is the `vpn_default` document of each rollout's database: a fresh env behaves like a fresh
tau2 process (what the recorded fixtures pin down), and within one env a broken VPN stays broken after reconnecting.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any, Callable

from domains.base import Store

# ---------------------------------------------------------------------------------------------------------------
# The phone's records, in tau2's field order with its defaults (user_db.toml only lists what differs)

APN_DEFAULT = {"apn_name": "internet", "reset_at_reboot": False, "mms_apn": "mms",
               "mmsc_url": "http://mms.carrier.com/mms/wapenc", "mms_proxy": None, "mms_port": None}
PERMISSIONS = ("sms", "storage", "phone", "network")  # AppPermissions' fields, in order
DEVICE_DEFAULT = {
    "sim_card_status": "active", "sim_card_missing": False, "airplane_mode": False,
    "network_signal_strength": "good", "network_technology_connected": "5G", "network_connection_status": "connected",
    "battery_level": 80, "data_enabled": True, "roaming_enabled": False, "network_mode_preference": "4g_5g_preferred",
    "active_apn_settings": APN_DEFAULT, "wifi_enabled": False, "wifi_connected": False, "wifi_ssid": None,
    "wifi_signal_strength": "none", "wifi_calling_enabled": False, "wifi_calling_mms_over_wifi": False,
    "data_saver_mode": False, "vpn_enabled_setting": False, "vpn_connected": False, "vpn_details": None,
    "app_statuses": {"messaging": {"app_name": "messaging", "permissions": dict(sms=True, storage=True, phone=True,
                                                                                network=False)},
                     "browser": {"app_name": "browser", "permissions": dict(sms=False, storage=True, phone=False,
                                                                            network=True)}},
}
SURROUNDINGS_DEFAULT = {
    "name": None, "phone_number": None, "is_abroad": False, "roaming_allowed": False,
    "signal_strength": {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"},
    "mobile_data_usage_exceeded": False, "line_active": True, "payment_request": None,
}
VPN_DEFAULT = {"server_address": "192.168.1.1", "protocol": "OpenVPN", "server_performance": "excellent"}
MODES = ("4g_5g_preferred", "4g_only", "3g_only", "2g_only")


def normalise_user_db(raw: dict) -> dict[str, dict]:
    """user_db.toml -> the `phone` collection: each record complete, in field order, as tau2's model_dump()."""
    dev = copy.deepcopy(DEVICE_DEFAULT) | {k: v for k, v in raw.get("device", {}).items()
                                           if k not in ("active_apn_settings", "app_statuses")}
    dev["active_apn_settings"] = APN_DEFAULT | raw.get("device", {}).get("active_apn_settings", {})
    if "app_statuses" in raw.get("device", {}):
        dev["app_statuses"] = {name: {"app_name": app["app_name"],
                                      "permissions": {p: app.get("permissions", {}).get(p, False) for p in PERMISSIONS}}
                               for name, app in raw["device"]["app_statuses"].items()}
    sur = copy.deepcopy(SURROUNDINGS_DEFAULT) | raw.get("surroundings", {})
    return {"device": dev, "surroundings": sur, "vpn_default": dict(VPN_DEFAULT)}


# ---------------------------------------------------------------------------------------------------------------
# Loading and saving the phone around one call


class Phone:
    """The device and surroundings documents of one env, loaded for one call and written back if they changed."""

    def __init__(self, db: Store):
        self.db = db
        self.dev, self.sur = db.get("phone", "device"), db.get("phone", "surroundings")
        self._before = (json.dumps(self.dev), json.dumps(self.sur))

    def save(self) -> None:
        for rid, doc, before in (("device", self.dev, self._before[0]), ("surroundings", self.sur, self._before[1])):
            if json.dumps(doc) != before:
                self.db.put("phone", rid, doc)


def phone_function(fn: Callable) -> Callable:
    """fn(phone, /, **kwargs) -> fn(db, /, **kwargs): load the phone, run, save it even if fn raised (tau2 never
    rolls back). The name tau2's TypeErrors print is `TelecomUserTools.<tool>()`, so the inner function gets it."""
    fn.__qualname__ = f"TelecomUserTools.{fn.__name__}"

    def run(db: Store, /, **kwargs):
        ph = Phone(db)
        try:
            return fn(ph, **kwargs)
        finally:
            ph.save()

    run.__name__, run.__qualname__, run.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    run.__wrapped__ = fn  # inspect.signature (the tool's schema) reads the real arguments through this
    run.__annotations__ = fn.__annotations__
    return run


# ---------------------------------------------------------------------------------------------------------------
# What tau2's attribute access does to a value that is not the model it expects


def _tname(x: Any) -> str:
    return type(x).__name__


def _value(x: Any) -> str:
    """`enum.value`: our enums are stored as their value strings; anything else stored by a bad call has none."""
    if isinstance(x, str):
        return x
    raise AttributeError(f"'{_tname(x)}' object has no attribute 'value'")


def _apn(dev: dict, attr: str) -> Any:
    """`device.active_apn_settings.<attr>`; a string (or list...) stored by set_apn_settings has no such attribute."""
    s = dev["active_apn_settings"]
    if isinstance(s, dict):
        return s.get(attr)
    raise AttributeError(f"'{_tname(s)}' object has no attribute '{attr}'")


# ---------------------------------------------------------------------------------------------------------------
# The simulation: network search, status bar, mobile data, speed, MMS (TELECOM.md section 4)


def _sim(dev: dict) -> str:
    return "missing" if dev["sim_card_missing"] else dev["sim_card_status"]


def _no_service(dev: dict) -> None:
    dev.update(network_connection_status="no_service", network_technology_connected="none",
               network_signal_strength="none")


def network_search(ph: Phone) -> None:
    """Where the phone connects after a search: the SIM and the preferred mode decide, then airplane mode, a broken
    APN or an inactive line force no service. Checked in tau2's order, so a string APN raises even in airplane mode."""
    dev, signal = ph.dev, ph.sur["signal_strength"]
    if _sim(dev) == "active":
        dev["network_connection_status"] = "connected"
        pref = dev["network_mode_preference"]
        pref = pref if isinstance(pref, str) else None  # None, 4 ... stored by a bad call: tau2's fallback is 4G
        if pref == "4g_5g_preferred":
            tech = "4G" if signal.get("5G", "none") == "none" else "5G"
        else:
            tech = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}.get(pref, "4G")
        dev["network_technology_connected"], dev["network_signal_strength"] = tech, signal.get(tech, "none")
    else:  # missing, PIN- or PUK-locked
        _no_service(dev)
    if dev["airplane_mode"]:
        _no_service(dev)
    if _apn(dev, "apn_name") == "broken":
        _no_service(dev)
    if not ph.sur["line_active"]:
        _no_service(dev)


SIGNAL_ICONS = {"none": "📵 No Signal", "poor": "📶¹ Poor", "fair": "📶² Fair", "good": "📶³ Good",
                "excellent": "📶⁴ Excellent"}


def status_bar(dev: dict) -> str:
    if dev["airplane_mode"]:
        parts = ["✈️ Airplane Mode"]
    else:
        tech = dev["network_technology_connected"]
        parts = [SIGNAL_ICONS.get(dev["network_signal_strength"], "📵 No Signal")]
        if tech != "none":
            parts.append(_value(tech))
        if dev["data_enabled"] and tech != "none":
            parts += ["📱 Data Enabled"] + (["🔽 Data Saver"] if dev["data_saver_mode"] else [])
        else:
            parts.append("📵 Data Disabled")
    if dev["wifi_enabled"] and dev["wifi_connected"]:
        parts.append(f"📡 Connected to {dev['wifi_ssid']}" if dev["wifi_ssid"] else "📡 Enabled")
    if dev["vpn_connected"]:
        parts.append("🔒 VPN Connected")
    parts.append(f"🔋 {dev['battery_level']}%")
    return " | ".join(parts)


def _sb(ph: Phone, text: str) -> str:
    return f"{text}\nStatus Bar: {status_bar(ph.dev)}"


def data_works(ph: Phone) -> bool:
    dev, sur = ph.dev, ph.sur
    if dev["airplane_mode"] or dev["network_signal_strength"] == "none":
        return False
    if dev["network_connection_status"] == "no_service":
        return False
    if sur["is_abroad"] and (not dev["roaming_enabled"] or not sur["roaming_allowed"]):
        return False  # abroad, data needs both the phone's roaming switch and the line's roaming
    return bool(dev["data_enabled"]) and not sur["mobile_data_usage_exceeded"]


TECH_SPEED = {"2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0), "5G": (50.0, 500.0), "none": (0.0, 0.0)}
SIGNAL_FACTOR = {"poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0, "none": 0.0}
SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}


def speed_test(ph: Phone) -> tuple[float | None, str]:
    """(Mbps, label), or (None, "No Connection"). The float arithmetic runs in tau2's order, rounding included."""
    if not data_works(ph):
        return None, "No Connection"
    dev = ph.dev
    vpn = dev["vpn_details"]
    base = 0.1 if dev["vpn_connected"] and vpn and vpn["server_performance"] == "poor" else 1.0
    if dev["data_saver_mode"]:
        base *= 0.2
    lo, hi = TECH_SPEED.get(dev["network_technology_connected"], (0.0, 0.0))
    speed = round((lo + hi) / 2.0 * SIGNAL_FACTOR.get(dev["network_signal_strength"], 0.0) * base, 2)
    for limit, label in ((1, "Very Poor"), (5, "Poor"), (25, "Fair"), (100, "Good")):
        if speed < limit:
            return speed, label
    return speed, "Excellent"


def mms_works(ph: Phone) -> bool:
    dev = ph.dev
    if not data_works(ph) or dev["network_technology_connected"] == "2G":
        return False
    if dev["wifi_calling_enabled"] and dev["wifi_calling_mms_over_wifi"]:
        return False  # the carrier does not support MMS over Wi-Fi
    if _apn(dev, "mmsc_url") is None:  # an empty URL passes
        return False
    app = dev["app_statuses"].get("messaging")
    return app is not None and app["permissions"]["storage"] and app["permissions"]["sms"]


def _disconnect_vpn(dev: dict) -> bool:
    if not dev["vpn_connected"]:
        return False
    dev["vpn_connected"], dev["vpn_details"] = False, None
    return True


def _clear_wifi(dev: dict) -> None:
    dev.update(wifi_connected=False, wifi_ssid=None, wifi_signal_strength="none")


def _toggle_airplane(ph: Phone) -> bool:
    dev = ph.dev
    was_on = dev["airplane_mode"]
    dev["airplane_mode"] = not was_on
    if was_on:  # turning off: search again, Wi-Fi drops its connection
        dev["network_connection_status"] = "searching"
        if dev["wifi_enabled"]:
            _clear_wifi(dev)
    else:  # turning on: Wi-Fi and the VPN disconnect
        _clear_wifi(dev)
        if dev["vpn_connected"]:
            _disconnect_vpn(dev)
    network_search(ph)
    return dev["airplane_mode"]


def _flip(ph: Phone, key: str, search: bool) -> bool:
    ph.dev[key] = not ph.dev[key]
    if search:
        network_search(ph)
    return ph.dev[key]


def _on_off(x: Any) -> str:
    return "ON" if x else "OFF"


# ---------------------------------------------------------------------------------------------------------------
# The 30 user tools. Docstrings are tau2's descriptions (what the customer's model reads in the tool schemas).


@phone_function
def check_status_bar(ph: Phone, /) -> str:
    """Shows what icons are currently visible in your phone's status bar (the area at the top of the screen). Displays
    network signal strength, mobile data status (enabled, disabled, data saver), Wi-Fi status, and battery level."""
    return f"Status Bar: {status_bar(ph.dev)}"


@phone_function
def check_network_status(ph: Phone, /) -> str:
    """Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane mode status, signal
    strength, network type, whether mobile data is enabled, and whether data roaming is enabled."""
    d = ph.dev
    lines = [f"Airplane Mode: {_on_off(d['airplane_mode'])}", f"SIM Card Status: {_value(_sim(d))}",
             f"Cellular Connection: {_value(d['network_connection_status'])}",
             f"Cellular Signal: {_value(d['network_signal_strength'])}",
             f"Cellular Network Type: {_value(d['network_technology_connected'])}",
             f"Mobile Data Enabled: {'Yes' if d['data_enabled'] else 'No'}",
             f"Data Roaming Enabled: {'Yes' if d['roaming_enabled'] else 'No'}",
             f"Wi-Fi Radio: {_on_off(d['wifi_enabled'])}", f"Wi-Fi Connected: {'Yes' if d['wifi_connected'] else 'No'}"]
    if d["wifi_connected"]:
        lines.append(f"Connected Wi-Fi Network: {d['wifi_ssid']}")
    return "\n".join(lines)


@phone_function
def check_network_mode_preference(ph: Phone, /) -> str:
    """Shows the current network mode preference."""
    return f"Network Mode Preference: {_value(ph.dev['network_mode_preference'])}"


@phone_function
def set_network_mode_preference(ph: Phone, /, mode: str) -> str:
    """Changes the type of cellular network your phone prefers to connect to (e.g., 5G, LTE/4G, 3G). Higher-speed
    networks (LTE/5G) provide faster data but may use more battery.

    Args:
        mode: The network mode to set: 4g_5g_preferred, 4g_only, 3g_only or 2g_only.
    """
    if isinstance(mode, str) and mode not in MODES:  # an invalid string: nothing stored, no search
        return _sb(ph, f"Failed to set network mode: '{mode}' is not a valid option. Please use one of: "
                       f"{', '.join(MODES)}")
    ph.dev["network_mode_preference"] = mode  # QUIRK: a non-string is stored unvalidated, then searched with
    network_search(ph)
    if mode is None:
        return _sb(ph, "Failed to set network mode: 'None' is not a valid option. Please use one of: "
                       f"{', '.join(MODES)}")
    return _sb(ph, f"Preferred Network Mode set to: {_value(mode)}")  # 4 -> "'int' object has no attribute 'value'"


@phone_function
def run_speed_test(ph: Phone, /) -> str:
    """Measures your current internet connection speed (download speed). Provides information about connection quality
    and what activities it can support."""
    speed, label = speed_test(ph)
    if speed is None:
        return f"Speed test failed: {label}."
    return f"Speed Test Result: {speed:.2f} Mbps ({label}). {SPEED_ADVICE[label]}"


@phone_function
def toggle_airplane_mode(ph: Phone, /) -> str:
    """Toggles Airplane Mode ON or OFF. When ON, it disconnects all wireless communications including cellular, Wi-Fi,
    and Bluetooth."""
    return _sb(ph, f"Airplane Mode is now {_on_off(_toggle_airplane(ph))}.")


SIM_TEXT = {"active": "Your SIM card is active and working.", "missing": "No SIM card detected in the phone.",
            "locked_pin": "The SIM card is locked with a PIN code.",
            "locked_puk": "The SIM card is locked with a PUK code."}


@phone_function
def check_sim_status(ph: Phone, /) -> str:
    """Checks if your SIM card is working correctly and displays its current status. Shows if the SIM is active,
    missing, or locked with a PIN or PUK code."""
    return SIM_TEXT[_sim(ph.dev)]


@phone_function
def reseat_sim_card(ph: Phone, /) -> str:
    """Simulates removing and reinserting your SIM card. This can help resolve recognition issues."""
    ph.dev["sim_card_missing"] = False  # a PIN/PUK lock stays: no tool undoes it
    network_search(ph)
    return _sb(ph, "SIM card re-seated successfully.")


@phone_function
def toggle_data(ph: Phone, /) -> str:
    """Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can use cellular data for
    internet access when Wi-Fi is unavailable."""
    return _sb(ph, f"Mobile Data is now {_on_off(_flip(ph, 'data_enabled', search=True))}.")


@phone_function
def toggle_roaming(ph: Phone, /) -> str:
    """Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas outside your carrier's
    coverage."""
    return _sb(ph, f"Data Roaming is now {_on_off(_flip(ph, 'roaming_enabled', search=True))}.")


@phone_function
def check_data_restriction_status(ph: Phone, /) -> str:
    """Checks if your phone has any data-limiting features active. Shows if Data Saver mode is on."""
    return "Data Saver mode is ON (limits data usage)." if ph.dev["data_saver_mode"] else "Data Saver mode is OFF."


@phone_function
def toggle_data_saver_mode(ph: Phone, /) -> str:
    """Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data speed."""
    return _sb(ph, f"Data Saver Mode is now {_on_off(_flip(ph, 'data_saver_mode', search=False))}.")


@phone_function
def check_apn_settings(ph: Phone, /) -> str:
    """Checks the technical APN settings your phone uses to connect to your carrier's mobile data network. Shows
    current APN name and MMSC URL for picture messaging."""
    _apn(ph.dev, "model_copy")  # tau2 copies the settings first: a string stored by a bad call fails here
    apn = ph.dev["active_apn_settings"]
    return (f"Current APN Name: {apn['apn_name'] or 'Not Set'}\nMMSC URL (for picture messages): "
            f"{apn['mmsc_url'] or 'Not Set'}\n(These are technical settings, usually best left unchanged.)")


@functools.cache
def _apn_model():
    """tau2's APNSettings as a pydantic model (built on first use: pydantic comes with openai, the import is slow)."""
    import enum
    from typing import Optional

    import pydantic

    class APNNames(str, enum.Enum):
        INTERNET = "internet"
        BROKEN = "broken"

    class APNSettings(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        apn_name: APNNames = APNNames.INTERNET
        reset_at_reboot: bool = False
        mms_apn: Optional[str] = "mms"
        mmsc_url: Optional[str] = "http://mms.carrier.com/mms/wapenc"
        mms_proxy: Optional[str] = None
        mms_port: Optional[int] = None

    return APNSettings, pydantic.ValidationError


def validate_apn(settings: dict) -> dict:
    """APNSettings(**settings) as tau2 validates it: the record ("8080" -> 8080), or pydantic's ValidationError text.

    pydantic writes the text itself; the link it ends with names pydantic's minor version, so that is pinned to
    the 2.14 tau2's recorded outputs were made with."""
    model, invalid = _apn_model()
    try:
        return model(**settings).model_dump(mode="json")
    except invalid as e:
        raise ValueError(re.sub(r"errors\.pydantic\.dev/[0-9.]+/", "errors.pydantic.dev/2.14/", str(e))) from None


@phone_function
def set_apn_settings(ph: Phone, /, apn_settings: dict) -> str:
    """Sets the APN settings for the phone.

    Args:
        apn_settings: The APN settings: apn_name, reset_at_reboot, mms_apn, mmsc_url, mms_proxy, mms_port.
    """
    if isinstance(apn_settings, dict):
        apn_settings = validate_apn(apn_settings)
    ph.dev["active_apn_settings"] = apn_settings  # QUIRK: a non-dict is stored as is, then breaks every search
    text = f"APN settings set to: {_value(_apn(ph.dev, 'apn_name'))}"
    network_search(ph)
    return _sb(ph, text)


@phone_function
def reset_apn_settings(ph: Phone, /) -> str:
    """Resets your APN settings to the default settings."""
    _apn(ph.dev, "reset_at_reboot")
    ph.dev["active_apn_settings"]["reset_at_reboot"] = True  # applied only by the next reboot_device
    network_search(ph)
    return _sb(ph, "APN settings will reset at reboot.")


@phone_function
def check_wifi_status(ph: Phone, /) -> str:
    """Checks your Wi-Fi connection status. Shows if Wi-Fi is turned on, which network you're connected to (if any),
    and the signal strength."""
    d = ph.dev
    if not d["wifi_enabled"]:
        return "Wi-Fi is turned OFF."
    if d["wifi_connected"]:
        return f"Wi-Fi is ON and connected to '{d['wifi_ssid']}'. Signal strength: {_value(d['wifi_signal_strength'])}."
    return "Wi-Fi is ON but not connected to any network."


@phone_function
def toggle_wifi(ph: Phone, /) -> str:
    """Toggles your phone's Wi-Fi radio ON or OFF. Controls whether your phone can discover and connect to wireless
    networks for internet access."""
    if ph.dev["airplane_mode"]:
        return _sb(ph, "Cannot change Wi-Fi settings while Airplane Mode is ON.")
    on = _flip(ph, "wifi_enabled", search=False)
    if not on:
        _clear_wifi(ph.dev)
    return _sb(ph, f"Wi-Fi is now {_on_off(on)}.")  # turning it on never connects to a network


@phone_function
def check_wifi_calling_status(ph: Phone, /) -> str:
    """Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and receive calls over a Wi-
    Fi network instead of using the cellular network."""
    return f"Wi-Fi Calling is currently turned {_on_off(ph.dev['wifi_calling_enabled'])}."


@phone_function
def toggle_wifi_calling(ph: Phone, /) -> str:
    """Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over Wi-Fi instead of the
    cellular network, which can help in areas with weak cellular signal."""
    return _sb(ph, f"Wi-Fi Calling is now {_on_off(_flip(ph, 'wifi_calling_enabled', search=False))}.")


def _vpn_repr(details: dict) -> str:
    # tau2 prints the Python repr of model_dump(), where the performance is still an enum member
    perf = details["server_performance"]
    return (f"{{'server_address': {details['server_address']!r}, 'protocol': {details['protocol']!r}, "
            f"'server_performance': <PerformanceLevel.{perf.upper()}: {perf!r}>}}")


@phone_function
def check_vpn_status(ph: Phone, /) -> str:
    """Checks if you're using a VPN (Virtual Private Network) connection. Shows if a VPN is active, connected, and
    displays any available connection details."""
    d = ph.dev
    if d["vpn_connected"]:
        if d["vpn_details"]:
            return f"VPN is ON and connected. Details: {_vpn_repr(d['vpn_details'])}"
        return "VPN is ON and connected (no specific details available)."
    if d["vpn_enabled_setting"]:
        return "VPN is turned ON in settings, but currently not connected."
    return "VPN is turned OFF."


def _connect_vpn(ph: Phone) -> str:
    if ph.dev["vpn_connected"]:
        return "VPN already connected."
    ph.dev["vpn_connected"] = True
    ph.dev["vpn_details"] = ph.db.get("phone", "vpn_default")  # QUIRK: tau2's one shared object (module docstring)
    return _sb(ph, "VPN connected successfully.")


@phone_function
def connect_vpn(ph: Phone, /) -> str:
    """Connects to your VPN (Virtual Private Network)."""
    return _connect_vpn(ph)


@phone_function
def disconnect_vpn(ph: Phone, /) -> str:
    """Disconnects any active VPN (Virtual Private Network) connection. Stops routing your internet traffic through a
    VPN server, which might affect connection speed or access to content."""
    done = _disconnect_vpn(ph.dev)
    return _sb(ph, "VPN disconnected successfully." if done else "No active VPN connection to disconnect.")


@phone_function
def check_installed_apps(ph: Phone, /) -> str:
    """Returns the name of all installed apps on the phone."""
    return f"The following apps are installed on the phone: {', '.join(ph.dev['app_statuses'])}"


def _granted(app: dict) -> list[str]:
    return [p for p, allowed in app["permissions"].items() if allowed]


@phone_function
def check_app_status(ph: Phone, /, app_name: str) -> str:
    """Checks detailed information about a specific app. Shows its permissions and background data usage settings.

    Args:
        app_name: The name of the app, such as 'messaging' or 'browser'.
    """
    app = ph.dev["app_statuses"].get(app_name)  # a list or dict name fails here: "unhashable type", as in tau2
    if app is None:
        return f"App '{app_name}' not found on this phone."
    perms = _granted(app)
    lines = [f"Status for App: {app_name}"]
    lines += [" - Permissions Granted:"] + [f"   - {p}" for p in perms] if perms else [" - Permissions: None granted."]
    return "\n".join(lines)


@phone_function
def check_app_permissions(ph: Phone, /, app_name: str) -> str:
    """Checks what permissions a specific app currently has. Shows if the app has access to features like storage,
    camera, location, etc.

    Args:
        app_name: The name of the app, such as 'messaging' or 'browser'.
    """
    app = ph.dev["app_statuses"].get(app_name)
    if app is None:
        return f"App '{app_name}' not found on this phone."
    perms = _granted(app)
    if not perms:
        return f"App '{app_name}' currently has no permissions granted."
    return f"App '{app_name}' has permission for: {', '.join(perms)}."


@phone_function
def grant_app_permission(ph: Phone, /, app_name: str, permission: str) -> str:
    """Gives a specific permission to an app (like access to storage, camera, or location). Required for some app
    functions to work properly.

    Args:
        app_name: The name of the app to grant the permission to.
        permission: The permission to grant, should be lowercase.
    """
    app = ph.dev["app_statuses"].get(app_name)
    permission = permission.lower()
    if app is None:
        return _sb(ph, f"Error. App '{app_name}' not found. Cannot grant permission.")
    if permission not in app["permissions"]:
        return _sb(ph, f"Error. Permission '{permission}' not tracked for app '{app_name}', available permissions: "
                       f"{list(PERMISSIONS)}")
    app["permissions"][permission] = True
    return _sb(ph, f"Success. Permission '{permission}' granted to app '{app_name}'.")


@phone_function
def can_send_mms(ph: Phone, /) -> str:
    """Checks if the default messaging app can send MMS messages."""
    return f"Your messaging app {'can' if mms_works(ph) else 'cannot'} send MMS messages."


@phone_function
def reboot_device(ph: Phone, /) -> str:
    """Restarts your phone completely. This can help resolve many temporary software glitches by refreshing all
    running services and connections."""
    lines = []
    if _apn(ph.dev, "reset_at_reboot"):  # a pending reset_apn_settings: back to the defaults (fixes a broken APN)
        lines.append("Resetting APN settings...")
        ph.dev["active_apn_settings"] = dict(APN_DEFAULT)
    lines.append("Restarting network services...")
    ph.dev["network_connection_status"] = "searching"
    network_search(ph)
    return _sb(ph, "\n".join(lines))


@phone_function
def check_payment_request(ph: Phone, /) -> str:
    """Checks if the agent has sent you a payment request."""
    req = ph.sur["payment_request"]
    if req is None:
        return "No payment request has been made."
    return f"You have a payment request for bill {req['bill_id']} of {req['amount_due']} USD."


@phone_function
def make_payment(ph: Phone, /) -> str:
    """Makes a payment for the bill that the agent has sent you."""
    req = ph.sur["payment_request"]
    if req is None:
        return "You do not have a payment request."
    req["paid"] = True  # the sync that follows marks the bill Paid and clears the request (telecom.sync)
    return f"Payment of {req['amount_due']} USD has been made for bill {req['bill_id']}."


USER_TOOLS = [check_status_bar, check_network_status, check_network_mode_preference, set_network_mode_preference,
              run_speed_test, toggle_airplane_mode, check_sim_status, reseat_sim_card, toggle_data, toggle_roaming,
              check_data_restriction_status, toggle_data_saver_mode, check_apn_settings, set_apn_settings,
              reset_apn_settings, check_wifi_status, toggle_wifi, check_wifi_calling_status, toggle_wifi_calling,
              check_vpn_status, connect_vpn, disconnect_vpn, check_installed_apps, check_app_status,
              check_app_permissions, grant_app_permission, can_send_mms, reboot_device, check_payment_request,
              make_payment]
USER_WRITE_TOOLS = {"set_network_mode_preference", "toggle_airplane_mode", "reseat_sim_card", "toggle_data",
                    "toggle_roaming", "toggle_data_saver_mode", "set_apn_settings", "reset_apn_settings", "toggle_wifi",
                    "toggle_wifi_calling", "connect_vpn", "disconnect_vpn", "grant_app_permission", "reboot_device",
                    "make_payment"}

def scratch_store() -> Store:
    """A phone alone in an in-memory database (no company side, so no sync): for the demos."""
    import sqlite3

    con = sqlite3.connect(":memory:", isolation_level=None)
    con.execute("ATTACH DATABASE ':memory:' AS base")
    for schema in ("main", "base"):
        con.execute(f"CREATE TABLE {schema}.phone (pos INTEGER NOT NULL, id TEXT PRIMARY KEY, doc TEXT NOT NULL)")
    db = Store(con, ["phone"])
    for rid, doc in normalise_user_db({}).items():
        db.put("phone", rid, doc)
    return db


if __name__ == "__main__":
    # The customer's side of a slow-data call: what each tool answers, as the customer's model would read it.
    db = scratch_store()
    tools = {fn.__name__: fn for fn in USER_TOOLS}
    for name, args in [("set_network_mode_preference", {"mode": "2g_only"}), ("run_speed_test", {}),
                       ("can_send_mms", {}), ("toggle_data_saver_mode", {}), ("run_speed_test", {}),
                       ("set_network_mode_preference", {"mode": "4g_5g_preferred"}), ("toggle_data_saver_mode", {}),
                       ("run_speed_test", {}), ("check_network_status", {})]:
        print(f"{name}({args or ''}) ->", tools[name](db, **args))
