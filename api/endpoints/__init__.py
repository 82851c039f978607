"""The HTTP API, one folder per endpoint family: `api_router.py` (its routes, registered with
api/routing.py), `protocol.py` (its wire models), `render.py` (its answers' shapes), and what
else the family needs. families.py lists the families the app registers under --api-prefix
(the UI's routes and Vertex AI's predict route depend on the settings: the app adds them)."""
