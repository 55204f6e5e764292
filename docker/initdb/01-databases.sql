-- Databases of the local stack: app (source), dw (warehouse target), airflow (metadata).
CREATE DATABASE app;
CREATE DATABASE dw;
CREATE DATABASE airflow;
\connect app
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                     amount numeric(12,2) NOT NULL, region text NOT NULL, note text);
-- Row-filter columns (amount, region) must be in the replica identity when UPDATE/DELETE are published.
CREATE UNIQUE INDEX orders_identity ON orders (id, amount, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_identity;
