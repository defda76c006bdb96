-- Number 12 is reserved for a change made on another branch; this empty
-- step only keeps the numbering contiguous here and is removed when that
-- branch's 0012 arrives.
SELECT 1;
