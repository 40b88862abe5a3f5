"""Schemathesis hooks for .ci/schemathesis.sh (loaded by SCHEMATHESIS_HOOKS).

Issue 42's timing keys have string formats no JSON Schema generator knows
how to fill: `cron` (a cron expression), `iana-time-zone` (a zone name of
the IANA database) and `date-time` (RFC 3339, which Python's isoformat of
a naive datetime is not). Each gets a strategy of values the node must
accept, so that the valid-data check means something; the invalid-data
check still mutates them (wrong types, lengths) as before.
"""

from datetime import datetime, timedelta, timezone

import schemathesis
from hypothesis import strategies as st

SECOND = st.sampled_from(["*", "0", "30", "*/5", "0,15,30,45", "10-20", "5-55/10"])
MINUTE = SECOND
HOUR = st.sampled_from(["*", "0", "9", "23", "*/6", "8-18", "0,12"])
DAY = st.sampled_from(["*", "1", "15", "28", "1-7", "*/10", "1,15"])
MONTH = st.sampled_from(["*", "1", "12", "JAN-MAR", "*/3", "jun,dec"])
WEEKDAY = st.sampled_from(["*", "0", "7", "MON-FRI", "sat,sun", "1-5/2"])


@st.composite
def cron(draw):
    fields = [draw(MINUTE), draw(HOUR), draw(DAY), draw(MONTH), draw(WEEKDAY)]
    if draw(st.booleans()):
        fields.insert(0, draw(SECOND))
    return " ".join(fields)


ZONES = st.sampled_from(
    ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe",
     "Pacific/Chatham", "America/Sao_Paulo", "Africa/Casablanca", "Etc/GMT+12"]
)


@st.composite
def rfc3339(draw):
    at = draw(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1)))
    minutes = draw(st.integers(min_value=-23 * 60, max_value=23 * 60))
    zone = timezone(timedelta(minutes=minutes))
    text = at.replace(tzinfo=zone).isoformat()
    return text.replace("+00:00", "Z") if draw(st.booleans()) else text


schemathesis.openapi.format("cron", cron())
schemathesis.openapi.format("iana-time-zone", ZONES)
schemathesis.openapi.format("date-time", rfc3339())
