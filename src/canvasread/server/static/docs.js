// Swagger UI for /docs. The page holds no data; /openapi.json and every "Try it out" request carry the API key
// the playground keeps in this origin's storage, so with --api-key on the docs open from the playground's link.
const { openapi } = document.currentScript.dataset;
const key = localStorage.getItem("canvasread.apiKey") || "";

window.ui = SwaggerUIBundle({
  url: openapi,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  requestInterceptor: (request) => {
    // A key set with Swagger's own "Authorize" button wins.
    if (key && !request.headers.Authorization) request.headers.Authorization = `Bearer ${key}`;
    return request;
  },
});
