-- Deterministic demo data: 5,000 customers, 500 products, 30,000 orders, ~90,000 order items.
SELECT setseed(0.42);

INSERT INTO customers (email, name, country, created_at)
SELECT format('customer%s@example.com', g),
       format('Customer %s', g),
       (ARRAY['DE', 'FR', 'US', 'GB', 'JP', 'BR', 'IN'])[1 + g % 7],
       timestamptz '2024-01-01' + (g || ' minutes')::interval
FROM generate_series(1, 5000) g;

INSERT INTO products (sku, title, price_cents)
SELECT format('SKU-%s', lpad(g::text, 5, '0')), format('Product %s', g), 100 + (g * 37) % 9900
FROM generate_series(1, 500) g;

INSERT INTO orders (customer_id, status, placed_at)
SELECT 1 + (g * 7919) % 5000,
       (ARRAY['pending', 'paid', 'shipped', 'cancelled'])[1 + (g * 31) % 4],
       timestamptz '2025-01-01' + (g || ' minutes')::interval
FROM generate_series(1, 30000) g;

INSERT INTO order_items (order_id, product_id, quantity)
SELECT o, 1 + (o * k * 13) % 500, 1 + (o + k) % 5
FROM generate_series(1, 30000) o, generate_series(1, 3) k
ON CONFLICT DO NOTHING;
