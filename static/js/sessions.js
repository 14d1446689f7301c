// Sessions pages: a websocket tells the page when one of your sessions changed, and htmx
// fetches the cards again. Without websockets the cards still poll while anything changes.
(function () {
  "use strict";
  if (!document.getElementById("session-cards") || !window.WebSocket || !window.htmx || !window.Portal) {
    return;
  }
  window.Portal.liveSocket("/ws/notifications/", function (message) {
    if (message.type === "session.changed" || message.type === "session.warning") {
      window.htmx.trigger(document.body, "sessions-changed");
    } else if (typeof message.type === "string" && message.type.indexOf("billing.") === 0) {
      window.htmx.trigger(document.body, "billing-changed");
    }
  });
})();
