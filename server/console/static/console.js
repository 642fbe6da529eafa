// walcast console: live regions follow /ui/events (server-sent events).
// The server re-renders the page's live region and sends it when it
// changed; this script only swaps it in. No build step, no dependencies.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var conn = document.getElementById("conn");
  if (!live || !window.EventSource) { return; }
  var src = live.getAttribute("data-src");
  if (!src) { return; }
  var es = new EventSource(src);
  es.addEventListener("open", function () { if (conn) { conn.className = "conn on"; } });
  es.addEventListener("error", function () { if (conn) { conn.className = "conn off"; } });
  es.addEventListener("update", function (ev) {
    live.innerHTML = ev.data;
    var n = Number(document.body.getAttribute("data-updates") || "0") + 1;
    document.body.setAttribute("data-updates", String(n));
    var u = document.getElementById("updated");
    if (u) { u.textContent = new Date().toISOString().replace("T", " ").slice(0, 23); }
  });
  es.addEventListener("gone", function () { es.close(); location.reload(); });
})();
