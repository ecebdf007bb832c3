// Run page: draw every chart once from the page's json_script, then extend the traces in
// place from ws/runs/<id>/ (Plotly.extendTraces; a chart's container is never replaced).
// On reconnect the socket resumes after the last seq applied, so nothing repeats or is lost.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const plotConfig = {responsive: true, displaylogo: false};
  const maxPoints = {};  // per chart; undefined keeps every point
  const MAX_LOG_LINES = 500;
  const TERMINAL = data.terminal_statuses;  // jobs/models/status.py, via the page
  let lastSeq = data.last_seq;

  for (const fig of data.charts) {
    maxPoints[fig.id] = fig.max_points;
    Plotly.newPlot("chart-" + fig.id, fig.traces, fig.layout, plotConfig);
  }

  function apply(msg) {
    if (msg.error) { console.error("run socket:", msg.error); return; }
    if (msg.alerts) { window.rlplaneAlerts.upsert(msg.alerts); return; }  // run_alerts.js
    if (msg.last_seq <= lastSeq) return;  // the server never resends; belt and braces
    for (const [id, u] of Object.entries(msg.charts)) {
      const update = {x: u.x, y: u.y};
      if (u.base) update.base = u.base;
      Plotly.extendTraces("chart-" + id, update, u.indices, maxPoints[id]);
    }
    for (const [id, html] of Object.entries(msg.swap)) {
      const el = document.getElementById(id);
      if (el) el.outerHTML = html;
    }
    // A run that ended live has nothing left to stop.
    const badge = document.getElementById("run-status");
    const stopForm = document.getElementById("stop-form");
    if (badge && stopForm && TERMINAL.includes(badge.textContent.trim())) stopForm.remove();
    for (const [id, html] of Object.entries(msg.append)) {
      const el = document.getElementById(id);
      if (!el) continue;
      el.insertAdjacentHTML("beforeend", html);
      while (el.children.length > MAX_LOG_LINES) el.firstElementChild.remove();
    }
    lastSeq = msg.last_seq;
  }

  window.rlplaneLiveSocket(data.ws_path, {  // live_socket.js
    onOpen: (ws) => ws.send(JSON.stringify({last_seq: lastSeq})),
    onMessage: apply,
  });
})();
