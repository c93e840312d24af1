// Package events holds the JSON Schemas of the events holdfast publishes
// (one file per EventBridge detail-type, the detail's schema), beside the
// HTTP API's OpenAPI document. A test validates every event the system
// tests emit against them (internal/testkit/eventschema).
package events

import "embed"

// Schemas is the schema files, named <detail-type>.json.
//
//go:embed *.json
var Schemas embed.FS
