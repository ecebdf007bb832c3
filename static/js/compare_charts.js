// Run compare: one chart per metric, a trace per run (jobs/charts.py compare_figures).
// The x axis switch redraws every chart's x from steps to wall seconds and back; each
// figure carries both (x: steps, wall: seconds since that run's first step).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("compare-data").textContent);
  const plotConfig = {responsive: true, displaylogo: false};
  const steps = {};
  for (const fig of data.charts) {
    steps[fig.id] = fig.traces.map((t) => t.x);
    Plotly.newPlot("chart-" + fig.id, fig.traces, fig.layout, plotConfig);
  }
  function setAxis(axis) {
    for (const fig of data.charts) {
      const xs = axis === "wall" ? fig.wall : steps[fig.id];
      Plotly.update("chart-" + fig.id, {x: xs}, {"xaxis.title.text": axis === "wall" ? "wall time (s)" : "step"});
    }
  }
  for (const radio of document.querySelectorAll('#axis-switch input[name="axis"]')) {
    radio.addEventListener("change", () => setAxis(radio.value));
  }
})();
