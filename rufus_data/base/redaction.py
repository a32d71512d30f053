"""Credentials never written out: a URL's userinfo (`http://user:key@host`) and key-like query
parameters (`?api_key=...`, `token`, `sig`, ...) are replaced by `***` wherever Rufus records a
URL: configs, manifests, dataset cards, reports, lock records, results and logs. The URL still
names its server, so a record says where a model was reached, never with what."""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "***"
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`\x1b]*[^\s'\"<>`\x1b.,;:!?)\]]")  # not a closing mark
QUERY_PAIR = re.compile(r"(^|[&;])([^=&;]*)=([^&;]*)")
KEY_LIKE = re.compile(r"key|token|secret|passw|sig|auth|credential|session", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its userinfo and the values of key-like query parameters hidden."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL after all (a bad port, brackets): hide whatever stands before an @
        return re.sub(r"//[^/@]*@", f"//{HIDDEN}@", url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{HIDDEN}@{netloc.rsplit('@', 1)[1]}"
    query = QUERY_PAIR.sub(lambda m: f"{m[1]}{m[2]}={HIDDEN}" if KEY_LIKE.search(m[2]) else m[0], parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """Every URL in free text (a message, a command line, a report) redacted."""
    return URL.sub(lambda match: redact_url(match.group(0)), text) if "://" in text else text


def redact(value):
    """A record (dicts, lists, tuples, strings, anything else as it is) with every URL in its
    strings redacted; keys are kept."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {key: redact(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(item) for item in value)
    return value


class RedactingFormatter(logging.Formatter):
    """A log file's formatter that hides credentials in the URLs of every line (train.log)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))
