// Package client is a Go client of holdfast's HTTP API, generated from
// api/openapi.yaml by oapi-codegen (pinned in go.mod as a tool):
//
//	c, _ := client.NewClientWithResponses(apiURL, client.WithRequestEditorFn(bearer(token)))
//	r, _ := c.ReserveWithResponse(ctx, &client.ReserveParams{IdempotencyKey: &key}, client.ReserveJSONRequestBody{Sku: "demo-phone", Qty: 1})
package client

//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../openapi.yaml
