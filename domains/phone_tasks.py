"""How a telecom task breaks the customer's phone, and how tau2's evaluator checks that it was fixed.

tau2 sets up each telecom task by calling functions of the two toolkits by name (`initialization_actions`:
turn_airplane_mode_on, unseat_sim_card, break_apn_settings, break_vpn, ...), and scores it by calling more of them
(`env_assertions`: assert_service_status, assert_internet_speed, ...). They are methods of tau2's TelecomUserTools
but not tools: the customer cannot call them (a call answers "Tool ... not found"). This file holds the phone's
side of them, on phone.py's simulation; domains/telecom.py runs them (`run_function`, a sync after each) and holds
the company side (set_data_usage, suspend_line_for_overdue_bill, assert_data_refueling_amount, ...).
TELECOM.md section 7 lists what each does; the notes below say where tau2's code is less obvious than its name.
"""

from __future__ import annotations

from typing import Callable

from domains.phone import (USER_TOOLS, Phone, _apn, _connect_vpn, _flip, _on_off, _toggle_airplane, data_works,
                           mms_works, network_search, phone_function, speed_test)


@phone_function
def set_user_info(ph: Phone, /, name: str, phone_number: str) -> None:
    ph.sur["name"], ph.sur["phone_number"] = name, phone_number


@phone_function
def set_user_location(ph: Phone, /, abroad: bool) -> None:
    ph.sur["is_abroad"] = abroad


def _until(ph: Phone, flip: Callable[[], bool], want: bool) -> None:
    # tau2's turn_*_on/off: toggle (with the toggle's side effects), and once more if that gave the wrong state
    if flip() != want:
        flip()


@phone_function
def turn_airplane_mode_on(ph: Phone, /) -> str:
    _until(ph, lambda: _toggle_airplane(ph), True)
    return "Airplane Mode is now ON."


@phone_function
def turn_airplane_mode_off(ph: Phone, /) -> str:
    _until(ph, lambda: _toggle_airplane(ph), False)
    return "Airplane Mode is now OFF."


@phone_function
def turn_data_off(ph: Phone, /) -> str:
    _until(ph, lambda: _flip(ph, "data_enabled", search=True), False)
    return "Data connection broken."


@phone_function
def turn_data_on(ph: Phone, /) -> str:
    ph.dev["data_enabled"] = True  # no search, unlike toggle_data
    return "Data connection restored."


@phone_function
def turn_roaming_on(ph: Phone, /) -> str:
    _until(ph, lambda: _flip(ph, "roaming_enabled", search=True), True)
    return "Data Roaming is now ON."


@phone_function
def turn_roaming_off(ph: Phone, /) -> str:
    _until(ph, lambda: _flip(ph, "roaming_enabled", search=True), False)
    return "Data Roaming is now OFF."


@phone_function
def turn_data_saver_mode_on(ph: Phone, /) -> str:
    _until(ph, lambda: _flip(ph, "data_saver_mode", search=False), True)
    return "Data Saver Mode is now ON."


@phone_function
def turn_data_saver_mode_off(ph: Phone, /) -> str:
    _until(ph, lambda: _flip(ph, "data_saver_mode", search=False), False)
    return "Data Saver Mode is now OFF."


@phone_function
def unseat_sim_card(ph: Phone, /) -> str:
    ph.dev["sim_card_missing"] = True
    network_search(ph)
    return "SIM card un-seated successfully."


@phone_function
def lock_sim_card(ph: Phone, /, mode: str) -> str:
    if mode in ("pin", "puk"):
        ph.dev["sim_card_status"] = f"locked_{mode}"
    network_search(ph)
    return f"SIM card locked successfully in {mode} mode."


@phone_function
def break_apn_settings(ph: Phone, /) -> str:
    _apn(ph.dev, "apn_name")
    ph.dev["active_apn_settings"]["apn_name"] = "broken"
    network_search(ph)
    assert ph.dev["network_connection_status"] == "no_service"
    return "APN settings broken. Please call reset_apn_settings() to fix."


@phone_function
def break_apn_mms_setting(ph: Phone, /) -> str:
    _apn(ph.dev, "mmsc_url")
    ph.dev["active_apn_settings"]["mmsc_url"] = None
    assert not mms_works(ph)
    return "APN MMS setting broken. Please call reset_apn_settings() to fix."


@phone_function
def break_vpn(ph: Phone, /) -> str:
    _connect_vpn(ph)
    details = ph.dev["vpn_details"]
    if details is None:
        raise AttributeError("'NoneType' object has no attribute 'server_performance'")
    details["server_performance"] = "poor"  # on the phone and, being one object in tau2, on the shared default
    ph.db.put("phone", "vpn_default", dict(details))
    return "VPN connection broken."


@phone_function
def remove_app_permission(ph: Phone, /, app_name: str, permission: str) -> tuple[bool, str]:
    app = ph.dev["app_statuses"].get(app_name)
    permission = permission.lower()
    if app is None:
        return False, f"App '{app_name}' not found. Cannot remove permission."
    if permission not in app["permissions"]:
        return False, f"Permission '{permission}' not tracked for app '{app_name}'."
    app["permissions"][permission] = False
    return True, f"Permission '{permission}' removed from app '{app_name}'."


@phone_function
def set_wifi_calling(ph: Phone, /, enabled: bool, mms_over_wifi: bool | None = None) -> str:
    if ph.dev["wifi_calling_enabled"] != enabled:
        _flip(ph, "wifi_calling_enabled", search=False)
    if mms_over_wifi is not None:
        ph.dev["wifi_calling_mms_over_wifi"] = mms_over_wifi
    return f"Wi-Fi Calling is now {_on_off(enabled)}."


@phone_function
def simulate_network_search(ph: Phone, /) -> None:
    network_search(ph)


# The evaluator's assertions: each returns a bool that is compared with the task's assert_value.

STATUSES = ("connected", "searching", "no_service", "emergency_only")


@phone_function
def assert_service_status(ph: Phone, /, expected_status: str) -> bool:
    if expected_status not in STATUSES:
        raise ValueError(f"{expected_status!r} is not a valid NetworkStatus")
    return ph.dev["network_connection_status"] == expected_status


@phone_function
def assert_mobile_data_status(ph: Phone, /, expected_status: bool) -> bool:
    return data_works(ph) == expected_status


@phone_function
def assert_internet_speed(ph: Phone, /, expected_speed: float, expected_desc: str | None = None) -> bool:
    speed, label = speed_test(ph)
    speed = speed or 0.0
    return speed >= expected_speed and (expected_desc is None or label.lower() == expected_desc.lower())


@phone_function
def assert_can_send_mms(ph: Phone, /, expected_status: bool) -> bool:
    return mms_works(ph) == expected_status


@phone_function
def assert_airplane_mode_status(ph: Phone, /, expected_status: bool) -> bool:
    return ph.dev["airplane_mode"] == expected_status


@phone_function
def assert_mobile_data_usage_exceeded(ph: Phone, /, expected_status: bool) -> bool:
    return ph.sur["mobile_data_usage_exceeded"] == expected_status


USER_FUNCTIONS = {fn.__name__: fn for fn in USER_TOOLS + [
    set_user_info, set_user_location, turn_airplane_mode_on, turn_airplane_mode_off, turn_data_off, turn_data_on,
    turn_roaming_on, turn_roaming_off, turn_data_saver_mode_on, turn_data_saver_mode_off, unseat_sim_card,
    lock_sim_card, break_apn_settings, break_apn_mms_setting, break_vpn, remove_app_permission, set_wifi_calling,
    simulate_network_search, assert_service_status, assert_mobile_data_status, assert_internet_speed,
    assert_can_send_mms, assert_airplane_mode_status, assert_mobile_data_usage_exceeded]}


if __name__ == "__main__":
    # Break a phone the way the task "[mms_issue]airplane_mode_on|break_apn_mms_setting" does, check it, fix it.
    from domains.phone import scratch_store

    db = scratch_store()
    for name in ("turn_airplane_mode_on", "break_apn_mms_setting"):
        print(f"init {name}() ->", USER_FUNCTIONS[name](db))
    check = lambda: USER_FUNCTIONS["assert_can_send_mms"](db, expected_status=True)  # noqa: E731
    print("MMS works:", check())
    for name in ("toggle_airplane_mode", "reset_apn_settings", "reboot_device"):
        print(f"{name}() ->", USER_FUNCTIONS[name](db).replace("\n", " / "))
        print("MMS works:", check())
