// The finance view's revenue chart: one bar-like line per UTC day from the page's JSON data block;
// a click on a day opens that day's usages. Data only, never markup built from strings.
(function () {
  "use strict";

  function draw(box) {
    var source = document.getElementById(box.dataset.revenueChart);
    if (!source || !window.uPlot) { return; }
    var chart = JSON.parse(source.textContent);
    var height = 220;
    var opts = {
      width: Math.max(box.clientWidth, 300),
      height: height,
      cursor: {drag: {x: false, y: false}},
      scales: {x: {time: true}, y: {range: function (u, min, max) { return [0, Math.max(max, 1) * 1.1]; }}},
      axes: [{size: 28, font: "11px system-ui"}, {size: 60, font: "11px system-ui"}],
      series: [{}, {label: "Revenue", stroke: "#2563eb", fill: "#2563eb22", width: 2,
        points: {show: true, size: 6}, value: function (u, v) { return v == null ? "—" : v.toFixed(2); }}]
    };
    var plot = new window.uPlot(opts, [chart.t, chart.amount], box);
    plot.over.addEventListener("click", function () {
      var index = plot.cursor.idx;
      if (index != null && chart.links[index]) { window.location.assign(chart.links[index]); }
    });
    if (window.ResizeObserver) {
      new window.ResizeObserver(function () {
        var width = Math.max(box.clientWidth, 300);
        if (width !== plot.width) { plot.setSize({width: width, height: height}); }
      }).observe(box);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-revenue-chart]").forEach(draw);
  });
})();
