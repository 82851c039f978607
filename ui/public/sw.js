// A no-op service worker (llama-server's UI ships one too): it takes over at once and lets every
// request go to the network, so a new build is never hidden behind a stale cache.
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));
