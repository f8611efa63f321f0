"""The PostgreSQL session store: schema and migrations (:mod:`.schema`), the store
(:mod:`.store`), its single writer per session (:mod:`.writer`) and JSONL import
(:mod:`.importer`). Importing this package imports nothing heavy; the store needs asyncpg."""
