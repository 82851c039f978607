"""What the api pod fetches from addresses a caller names (media URLs, /cors-proxy): the
address policy (`policy.py`: private, loopback, link-local and metadata ranges refused unless
--fetch-allow lists them) and the httpx transport that applies it to every connection, every
redirect hop included, after DNS resolution (`transport.py`)."""
