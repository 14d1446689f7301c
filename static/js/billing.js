// Billing regions (the dashboard's notices, the billing page's figures): the notification socket says when
// money moved (a charge, a zero balance, a budget alert) and htmx fetches those regions again.
(function () {
  "use strict";
  if (!document.querySelector("[data-billing-live]") || !window.WebSocket || !window.htmx || !window.Portal) {
    return;
  }
  window.Portal.liveSocket("/ws/notifications/", function (message) {
    if (typeof message.type !== "string") { return; }
    if (message.type.indexOf("billing.") === 0 || message.type === "session.changed") {
      window.htmx.trigger(document.body, "billing-changed");
    }
  });
})();
