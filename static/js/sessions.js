// Sessions page: a websocket tells the page when one of your sessions changed, and htmx
// fetches the cards again. Without websockets the cards still poll while anything changes.
(function () {
  "use strict";
  if (!document.getElementById("session-cards") || !window.WebSocket || !window.htmx) {
    return;
  }
  var delay = 1000;
  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + window.location.host + "/ws/notifications/");
    socket.onopen = function () { delay = 1000; };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (error) { return; }
      if (message.type === "session.changed" || message.type === "session.warning") {
        window.htmx.trigger(document.body, "sessions-changed");
      }
    };
    socket.onclose = function (event) {
      if (event.code === 4401) { return; }  // logged out: reconnecting will not help
      window.setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
