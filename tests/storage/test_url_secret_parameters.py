"""Secrets a URL carries outside the parameters SECRET_PARAMETERS names are printed (issue 52, finding 4).

A URL with a query or fragment is refused, and the refusal quotes it: `api_key=`/`apikey=`/`client_secret=`
values (common API-key and OAuth parameters) and a fragment's `access_token=` (OAuth's implicit flow)
are printed as given."""
from __future__ import annotations

import pytest

from precompile.storage.locations import redacted


@pytest.mark.parametrize("url", [
    "https://host/x.py?api_key=SECRET", "https://host/x.py?apikey=SECRET", "https://host/x.py?client_secret=SECRET",
    "https://host/x.py#access_token=SECRET", "https://host/x.py?a=1#token=SECRET",
])
def test_every_secret_a_url_carries_is_redacted(url):
    assert "SECRET" not in redacted(f"could not read {url}: refused")
