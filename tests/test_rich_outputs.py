"""Rich outputs of real kernels: an object with only an HTML repr shows its HTML as text."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}


async def test_objects_with_only_html_show_their_html_as_text(evaluate):
    result = await evaluate(
        "import pandas as pd\n"
        "class T:\n"
        "    def _repr_html_(self):\n"
        "        return '<h3>Report</h3><p>total: <b>42</b></p>'\n"
        "df = pd.DataFrame({'name': ['ada', 'bob'], 'score': [3, 4]})\n"
        "T()",
        "df.style",
        "df",
    )
    html_only, styler, frame = (cell["output"] for cell in result["cells"])
    assert html_only == "### Report\n\ntotal: **42**\n"
    assert "at 0x" not in styler
    rows = [line.replace(" ", "") for line in styler.splitlines()]
    assert "|name|score|" in rows[0] and "|ada|3|" in "".join(rows) and "|bob|4|" in "".join(rows)
    assert frame.splitlines() == ["  name  score", "0  ada      3", "1  bob      4"]  # plain text stays
