package mysqlstore

// MigrationCount is how many migrations are embedded: Latest's number while
// they are numbered without a gap (a branch may lack a number another one adds).
func MigrationCount() int {
	files, _ := migrationFiles()
	return len(files)
}
