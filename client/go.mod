module github.com/idempay/idempay/client

go 1.26.0

require github.com/standard-webhooks/standard-webhooks/libraries v0.0.1
