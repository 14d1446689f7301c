// Live GPU charts and fleet tiles, fed by /ws/metrics/... websockets.
//
// - [data-live-session]: charts of one session's slice (last 15 minutes, one point a second).
// - [data-history]: a session's per-minute history, drawn once from the page's JSON.
// - #fleet-tiles: one tile per GPU and MIG device, updated in place (staff).
// Memory stays flat however long a page is open: each series is a ring of at most 900 points.
(function () {
  "use strict";
  // 15 minutes at one frame a second; a page (or a test) may set a shorter ring before this script runs.
  var WINDOW = window.PORTAL_CHART_POINTS || 900;
  var FIGURES = [
    {key: "util", label: "Utilization", unit: "%", color: "#2563eb", max: 100},
    {key: "mem", label: "Memory", unit: "GiB", color: "#7c3aed"},
    {key: "temp", label: "Temperature", unit: "°C", color: "#dc2626"},
    {key: "power", label: "Power", unit: "W", color: "#d97706"}
  ];

  function socketUrl(path) {
    return (window.location.protocol === "https:" ? "wss://" : "ws://") + window.location.host + path;
  }

  // A websocket that comes back by itself after a dropped connection or a server restart.
  function live(path, onFrame, onState) {
    var delay = 1000;
    function connect() {
      var socket = new WebSocket(socketUrl(path));
      socket.onopen = function () { delay = 1000; onState("live"); };
      socket.onmessage = function (event) {
        var frame;
        try { frame = JSON.parse(event.data); } catch (error) { return; }
        if (frame.kind) { onFrame(frame); }
      };
      socket.onclose = function (event) {
        if (event.code === 4401 || event.code === 4403) { onState(event.code === 4401 ? "logged-out" : "forbidden"); return; }
        onState("reconnecting");
        window.setTimeout(connect, delay);
        delay = Math.min(delay * 2, 15000);
      };
    }
    connect();
  }

  function fmt(value, unit) {
    return value === null || value === undefined ? "n/a" : (Math.round(value * 10) / 10) + " " + unit;
  }

  function chart(target, figure, height, data) {
    var opts = {
      width: Math.max(target.clientWidth, 200), height: height,
      legend: {show: false}, cursor: {show: false},
      scales: {x: {time: true}, y: figure.max ? {range: [0, figure.max]} : {range: function (u, lo, hi) { return [0, Math.max(hi * 1.2, 1)]; }}},
      axes: [{size: 28, font: "11px system-ui"}, {size: 44, font: "11px system-ui"}],
      series: [{}, {label: figure.label, stroke: figure.color, fill: figure.color + "22", width: 1.5, spanGaps: false}]
    };
    var plot = new window.uPlot(opts, data, target);
    // Follow the panel's width (window resizes, the grid reflowing); the height stays.
    if (window.ResizeObserver) {
      new window.ResizeObserver(function () {
        var width = Math.max(target.clientWidth, 200);
        if (width !== plot.width) { plot.setSize({width: width, height: height}); }
      }).observe(target);
    }
    return plot;
  }

  // Lay out one captioned panel per figure first, then draw: each chart takes its panel's width.
  function panels(box, figures, caption) {
    var areas = {};
    figures.forEach(function (figure) {
      var panel = document.createElement("figure");
      panel.className = "chart";
      panel.innerHTML = "<figcaption>" + caption(figure) + "</figcaption>";
      var area = document.createElement("div");
      area.className = "chart-area";
      panel.appendChild(area);
      box.appendChild(panel);
      areas[figure.key] = area;
    });
    return areas;
  }

  // One session's live charts: a ring of points per figure, redrawn in place.
  function sessionCharts(box) {
    var session = Number(box.dataset.liveSession);
    var compact = box.hasAttribute("data-compact");
    var figures = compact ? FIGURES.slice(0, 1) : FIGURES;
    var height = compact ? 70 : 130;
    var times = [], series = {}, plots = {}, points = 0;
    var areas = panels(box, figures, function (figure) {
      return figure.label + " <output data-figure='" + figure.key + "'>…</output>";
    });
    figures.forEach(function (figure) {
      series[figure.key] = [];
      plots[figure.key] = chart(areas[figure.key], figure, height, [[], []]);
    });
    var status = document.querySelector("[data-live-status='" + session + "']");
    function onFrame(frame) {
      var mine = (frame.devices || []).filter(function (d) { return d.session === session; })[0];
      if (!mine) { return; }
      var values = {util: mine.util, mem: mine.mem_used === null ? null : mine.mem_used / 1024, temp: mine.temp, power: mine.power};
      times.push(frame.t);
      if (times.length > WINDOW) { times.shift(); }
      figures.forEach(function (figure) {
        var list = series[figure.key];
        list.push(values[figure.key]);
        if (list.length > WINDOW) { list.shift(); }
        plots[figure.key].setData([times, list]);
        var out = box.querySelector("output[data-figure='" + figure.key + "']");
        if (out) { out.textContent = fmt(values[figure.key], figure.unit); }
      });
      points += 1;
      box.dataset.points = String(points);
      box.dataset.held = String(times.length);
      box.dataset.lastUtil = String(values.util);
    }
    // No frame after a few seconds: say so instead of an empty chart (the GPU agent may not be running).
    window.setTimeout(function () {
      if (points) { return; }
      box.querySelectorAll("output[data-figure]").forEach(function (out) { out.textContent = "no figures yet"; });
    }, 5000);
    live("/ws/metrics/sessions/" + session + "/", onFrame, function (state) {
      box.dataset.state = state;
      if (status) { status.textContent = {live: "live", reconnecting: "reconnecting…", "logged-out": "log in again to see live figures", forbidden: "not yours"}[state] || state; }
    });
  }

  function historyChart(box) {
    var rows = JSON.parse(document.getElementById(box.dataset.history).textContent);
    if (!rows.length) { box.innerHTML = "<p class='muted'>No history yet: the first minute is stored when it ends.</p>"; return; }
    var times = rows.map(function (r) { return r.t; });
    var areas = panels(box, FIGURES, function (figure) { return figure.label + " (per-minute mean, " + figure.unit + ")"; });
    FIGURES.forEach(function (figure) {
      var values = rows.map(function (r) { return figure.key === "mem" ? (r.mem_used === null ? null : r.mem_used / 1024) : r[figure.key]; });
      chart(areas[figure.key], figure, 110, [times, values]);
    });
  }

  // Fleet tiles: one per GPU, with its MIG devices; colour follows utilisation.
  function heat(util) {
    if (util === null || util === undefined) { return "var(--tile-none)"; }
    var hue = 210 - Math.round(Math.min(util, 100) * 2.1);
    return "hsl(" + hue + " 70% " + (92 - util * 0.35) + "%)";
  }

  function who(users) {
    return users && users.length ? users.map(function (u) { return u.user + (u.session ? " #" + u.session : (u.holder ? " (" + u.holder + ")" : "")); }).join(", ") : "free";
  }

  function fleetTiles(root) {
    var tiles = {};
    function tileFor(gpu) {
      var tile = tiles[gpu.uuid];
      if (!tile) {
        tile = document.createElement("article");
        tile.className = "gpu-tile";
        tile.dataset.uuid = gpu.uuid;
        root.appendChild(tile);
        tiles[gpu.uuid] = tile;
      }
      return tile;
    }
    function onFrame(frame) {
      if (frame.kind !== "fleet") { return; }
      frame.gpus.forEach(function (gpu) {
        var tile = tileFor(gpu);
        var devices = gpu.devices.map(function (d) {
          return "<li style='background:" + heat(d.util) + "'><strong>" + d.profile + "</strong> " +
            (d.util === null ? "util n/a" : Math.round(d.util) + "%") + " · " + fmt(d.mem_used / 1024, "GiB") +
            "<br><span class='muted'>" + who(d.users) + "</span></li>";
        }).join("");
        tile.style.background = heat(gpu.util);
        tile.innerHTML = "<header><strong>" + gpu.host + " GPU " + gpu.index + "</strong> " + gpu.model +
          (frame.simulated ? " <span class='badge warn'>simulated</span>" : "") + "</header>" +
          (gpu.problem ? "<p class='error'>" + gpu.problem + "</p>" : "") +
          "<p>util " + (gpu.util === null ? "per device" : Math.round(gpu.util) + "%") + " · mem " +
          fmt(gpu.mem_used / 1024, "GiB") + " / " + fmt(gpu.mem_total / 1024, "GiB") + " · " + fmt(gpu.temp, "°C") +
          " · " + fmt(gpu.power, "W") + "</p>" +
          (gpu.devices.length ? "<ul class='mig-devices'>" + devices + "</ul>" : "<p class='muted'>" + who(gpu.users) + "</p>");
      });
      root.dataset.frames = String(Number(root.dataset.frames || 0) + 1);
    }
    var status = document.querySelector("[data-fleet-status]");
    live("/ws/metrics/fleet/", onFrame, function (state) { if (status) { status.textContent = state; } });
  }

  function startCharts() {
    if (!window.uPlot || !window.WebSocket) { return; }
    document.querySelectorAll("[data-live-session]").forEach(function (box) {
      if (!box.dataset.started) { box.dataset.started = "1"; sessionCharts(box); }
    });
  }

  function start() {
    startCharts();
    if (window.uPlot) { document.querySelectorAll("[data-history]").forEach(historyChart); }
    var tiles = document.getElementById("fleet-tiles");
    if (tiles && window.WebSocket) { fleetTiles(tiles); }
  }
  // Session cards are swapped by htmx; their chart boxes are kept (hx-preserve), new ones start here.
  document.addEventListener("htmx:afterSettle", startCharts);
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
