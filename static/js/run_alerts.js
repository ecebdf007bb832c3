// Run page alerts: the socket sends {alerts: {"alert-<id>": html}}; an alert already shown
// is replaced in place, a new one goes on top. ?step=N (an alert's step link) marks that
// step on every chart.
(function () {
  "use strict";
  const list = document.getElementById("run-alerts");

  function upsert(alerts) {
    for (const [id, html] of Object.entries(alerts)) {
      const el = document.getElementById(id);
      if (el) { el.outerHTML = html; continue; }
      const empty = list.querySelector(".no-alerts");
      if (empty) empty.remove();
      list.insertAdjacentHTML("afterbegin", html);
      if (window.htmx) htmx.process(list.firstElementChild);  // its ack / resolve forms
    }
  }
  window.rlplaneAlerts = {upsert};

  const step = new URLSearchParams(location.search).get("step");
  if (step !== null && window.Plotly) {
    for (const chart of document.querySelectorAll("#charts .chart:not(#chart-timeline)")) {
      Plotly.relayout(chart, {shapes: [{type: "line", x0: +step, x1: +step, yref: "paper",
                                        y0: 0, y1: 1, line: {color: "#9b1c1c", dash: "dot"}}]});
    }
  }
})();
