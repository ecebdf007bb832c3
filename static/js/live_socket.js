// A websocket that comes back: the live pages' one connection to the server.
//
//   liveSocket(path, {onOpen(ws), onMessage(msg)})
//
// Each message is parsed as JSON and handed to onMessage. A closed socket reconnects
// after 1 s, doubling up to 30 s while the server stays away, and back to 1 s once a
// connection opens; onOpen runs on every (re)connect, so a page can say where to resume.
(function () {
  "use strict";

  function liveSocket(path, {onOpen = () => {}, onMessage}) {
    let retryMs = 1000;

    function connect() {
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      const ws = new WebSocket(scheme + location.host + path);
      ws.onopen = () => { retryMs = 1000; onOpen(ws); };
      ws.onmessage = (e) => onMessage(JSON.parse(e.data));
      ws.onclose = () => { setTimeout(connect, retryMs); retryMs = Math.min(retryMs * 2, 30000); };
    }
    connect();
  }
  window.rlplaneLiveSocket = liveSocket;
})();
