"""The viewer shows the lineage of calls: compaction calls with the summary they wrote and
what it replaced, the calls that send it, and fallback attempts."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.edge.errors import ProviderUnavailable
from sessions.jsonl import JsonlSessionStore
from tests.app.admin.helpers import serve, site_for
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core
from tests.gateway.test_compaction import FILLER, summarising


async def test_session_page_shows_compaction_and_fallback_lineage(tmp_path: Path) -> None:
    """Call badges name the summary call and the messages it replaced; the compaction call
    shows the summary it wrote; the fallback names the call it followed."""
    data = tmp_path / "d"
    primary = ScriptedProvider(responder=summarising)
    backup = ScriptedProvider(name="backup", responder=summarising)
    primary.script(*["noted"] * 4, ProviderUnavailable("primary: HTTP 529", status=529))
    async with running_core(JsonlSessionStore(data), primary, tmp_path / "p", window_tokens=400,
                            fallbacks=[backup]) as core:
        accepted = None
        for n in range(6):
            accepted = await core.channel.say("c1", f"message {n}: {FILLER}")
            await core.channel.wait_replies(n + 1)
        assert accepted is not None
        session = accepted.session_id or ""
    async with serve(site_for(data)) as viewer:
        status, page = await viewer.get(f"/admin/session/{session}")
    assert status == 200
    badges = re.findall(r'class="badge lineage">([^<]+)<', page)
    # In conversation order: the compaction call sits before the answer of its turn.
    assert badges == ["compaction: summary of log messages #1 to #6",
                      "fallback; after call 5 failed",
                      "sends the summary of call 7 in place of log messages #1 to #6"]
    assert "<h4>Summary written</h4><pre class=\"prompt\">covered: message 0; message 1; " \
           "message 2</pre>" in page
