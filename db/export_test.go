package db

// MigrateFS lets the tests run the migrator over files of their own.
var MigrateFS = migrateFS
