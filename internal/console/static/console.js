// The console's live pages: every poll interval, an open page asks the
// server for its content again (header X-Console-Live: 1, which renders the
// content alone) and swaps it in when it changed. No build step, no
// library: the server renders everything. A 401 means the session ended
// (signed out, or its API key revoked): go to the sign-in page. A refresh
// that gets no page (the server down, or failing) shows the notice that
// the page is not live, until one does: the content left in place is no
// longer the present. A 404 is a page: what was shown is gone.
"use strict";
(function () {
  const main = document.getElementById("content");
  const ms = main && Number(main.dataset.pollMs);
  if (!ms) {
    return;
  }
  const stale = document.getElementById("live-stale");
  let busy = false;
  // same tells whether html is what the page shows: both as the browser
  // writes them out again, since the server's text differs from the DOM's
  // in its escapes and whitespace even when nothing changed. A swap
  // replaces every node, and with them what the reader selected.
  const parsed = document.createElement("template");
  function same(html) {
    parsed.innerHTML = html;
    return parsed.innerHTML.trim() === main.innerHTML.trim();
  }
  async function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    try {
      const res = await fetch(window.location.href, {
        headers: { "X-Console-Live": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (res.status === 401) {
        window.location.assign("/login");
        return;
      }
      if (!res.ok && res.status !== 404) {
        stale.hidden = false; // the next poll tries again
        return;
      }
      const html = await res.text();
      stale.hidden = true;
      if (!same(html)) {
        main.innerHTML = html;
        main.dataset.refreshedAt = String(Date.now());
      }
    } catch (e) {
      stale.hidden = false; // the server restarting: the next poll tries again
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, ms);
})();
