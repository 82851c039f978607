// What the browser keeps: conversations, the user's own settings, the API key (localStorage).
const CONVERSATIONS = 'llamaq.conversations';
const SETTINGS = 'llamaq.settings';
const KEY = 'llamaq.apiKey';

function read(name, fallback) {
  try {
    const raw = localStorage.getItem(name);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

export const loadConversations = () => read(CONVERSATIONS, []);
export const saveConversations = (list) => localStorage.setItem(CONVERSATIONS, JSON.stringify(list));
export const loadUserSettings = () => read(SETTINGS, {});
export const saveUserSettings = (s) => localStorage.setItem(SETTINGS, JSON.stringify(s));
export const loadKey = () => localStorage.getItem(KEY) || '';
export const saveKey = (key) => localStorage.setItem(KEY, key);
export const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
