"""The OpenAI-compatible HTTP server: the app (api_server), the request schemas and error bodies
(protocol/), one handler per endpoint (handlers/), HTTP plumbing (http/) and tool calling (tools/)."""
