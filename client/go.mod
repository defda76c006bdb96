module github.com/idempay/idempay/client

go 1.26.0
