-- Run once, by the postgres image, on an empty data volume (`down -v` empties it).
-- The shop's store and orders live in `shop`; POSTGRES_DB (`test`) is the test suite's.
CREATE DATABASE shop;
