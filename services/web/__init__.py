"""The Memory tab: server-rendered pages for members and operators (`/ui`), whose every action
is a call of the JSON API made by the page's own small script (services/web/static/app.js)."""
