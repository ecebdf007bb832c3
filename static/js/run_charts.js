// Run page: draw every chart once from the page's json_script, then extend the traces in
// place from ws/runs/<id>/ (Plotly.extendTraces; a chart's container is never replaced).
// On reconnect the socket resumes after the last seq applied, so nothing repeats or is lost.
// Each live control applied (checkpoint, pause, lr, eval cadence) is a dotted vertical line
// at the step it took effect from, on every metric chart (Plotly.relayout of the shapes).
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

  const marks = [];  // jobs/charts.py control_marks: {step, label}
  function addMarks(more) {
    if (!more || !more.length) return;
    marks.push(...more);
    const shapes = marks.map((m) => ({
      type: "line", xref: "x", yref: "paper", x0: m.step, x1: m.step, y0: 0, y1: 1,
      line: {color: "#4b2e9c", width: 1, dash: "dot"}}));
    const annotations = marks.map((m) => ({
      x: m.step, xref: "x", y: 1, yref: "paper", text: m.label, showarrow: false,
      textangle: -90, xanchor: "right", yanchor: "top", font: {size: 10, color: "#4b2e9c"}}));
    for (const fig of data.charts) {
      if (fig.id === "timeline") continue;  // a time axis, not steps
      Plotly.relayout("chart-" + fig.id, {shapes: shapes, annotations: annotations});
    }
  }
  addMarks(data.marks);

  function apply(msg) {
    if (msg.error) { console.error("run socket:", msg.error); return; }
    if (msg.alerts) { window.rlplaneAlerts.upsert(msg.alerts); return; }  // run_alerts.js
    if (msg.last_seq <= lastSeq) return;  // the server never resends; belt and braces
    for (const [id, u] of Object.entries(msg.charts)) {
      if (!(id in maxPoints)) continue;  // a chart this run's page does not draw
      const update = {x: u.x, y: u.y};
      if (u.base) update.base = u.base;
      Plotly.extendTraces("chart-" + id, update, u.indices, maxPoints[id]);
    }
    addMarks(msg.marks);
    for (const [id, html] of Object.entries(msg.swap)) {
      const el = document.getElementById(id);
      if (el) el.outerHTML = html;
    }
    // A run that ended live has nothing left to stop.
    const badge = document.getElementById("run-status");
    const shown = badge ? badge.textContent.trim() : "";
    const stopForm = document.getElementById("stop-form");
    if (stopForm && TERMINAL.includes(shown)) stopForm.remove();
    const controls = document.getElementById("live-controls");
    if (controls && TERMINAL.includes(shown)) controls.remove();
    const pause = document.getElementById("control-pause");
    const resume = document.getElementById("control-resume");
    if (pause && resume && badge) {
      pause.hidden = shown === "paused";
      resume.hidden = shown !== "paused";
    }
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
