"""Start kimina-lean-server 2.1.3 (`kimina-ast-server`) without its database: run with the server's own Python
(.venv-kimina, or the kimina image), never ours. Stdlib and the server's packages only.

The server's code runs unchanged; two things stand between it and a start where the network is closed:

- Its database is optional (off unless LEAN_SERVER_DATABASE_URL is set: `db.connected` stays False and no
  query is made), but `server/prisma_client.py` imports a generated Prisma client at import time and, when
  none is generated, runs `prisma generate`, which downloads the Prisma CLI and its engines. So the server gets a
  `server.prisma_client` module whose `prisma` refuses every use: with the database off, nothing uses it. With
  LEAN_SERVER_DATABASE_URL set this launcher refuses to start (run the server's own image for that).
- On Python 3.11, kimina-ast-client 0.2.2 (`kimina_client/models.py`) takes `typing.TypedDict`, which pydantic
  2 refuses below Python 3.12 (`Please use typing_extensions.TypedDict`): the server cannot start at all,
  though both packages declare Python >= 3.9. Below 3.12 `typing.TypedDict` is set to typing_extensions' before
  the server is imported; from 3.12 on nothing is changed.

Then it runs the server's entry point (`kimina-ast-server`, settings from LEAN_SERVER_* variables).
"""

import os
import sys
import types
import typing


class _NoDatabase:
    """Stands for the Prisma client: any use says the database is off."""

    def __getattr__(self, name: str):
        raise RuntimeError(f"kimina launched without its database: prisma.{name} is not available")


def main() -> None:
    if os.environ.get("LEAN_SERVER_DATABASE_URL"):
        sys.exit("launch.py runs kimina without a database: unset LEAN_SERVER_DATABASE_URL")
    if sys.version_info < (3, 12):
        import typing_extensions

        typing.TypedDict = typing_extensions.TypedDict
    import server

    stand_in = types.ModuleType("server.prisma_client")
    stand_in.prisma = _NoDatabase()
    sys.modules["server.prisma_client"] = stand_in
    server.prisma_client = stand_in
    from server.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()
